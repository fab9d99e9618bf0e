"""The physics backends' names, in a module that imports nothing: command
lines list them (``--backend``) without importing JAX or MuJoCo.
`racing_env.backends.BACKENDS` maps each name to its backend class."""

#: MuJoCo's C library, float64, one world on the host (`racing_env.physics.CpuReferencePhysics`).
CPU_REFERENCE = "cpu_reference"
#: MJX-Warp's engine, float32, any number of worlds on the device (`racing_env.physics.MjxWarpPhysics`).
MJX_WARP = "mjx_warp"
#: Every backend's name, in the order messages and command lines list them.
BACKEND_NAMES: tuple[str, ...] = (CPU_REFERENCE, MJX_WARP)
