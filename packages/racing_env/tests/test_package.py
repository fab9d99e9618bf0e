import racing_env


def test_version():
    assert racing_env.__version__ == "0.1.0"


def test_declared_dependencies_import():
    import gymnasium
    import jax
    import mujoco
    from mujoco import mjx

    assert jax.numpy.add(1, 2) == 3
    assert mujoco.mj_versionString().startswith("3.17")
    assert hasattr(mjx, "put_model")
    assert gymnasium.__version__.startswith("1.4")
