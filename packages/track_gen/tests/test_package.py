import subprocess
import sys

import track_gen


def test_version():
    assert track_gen.__version__ == "0.1.0"


def test_importing_track_gen_never_imports_torch():
    code = "import sys, track_gen; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_warp_runs_on_the_cpu_device():
    import warp as wp

    wp.init()
    x = wp.array([1.0, 2.0, 3.0], dtype=wp.float32, device="cpu")
    assert wp.get_device("cpu").is_cpu
    assert x.numpy().tolist() == [1.0, 2.0, 3.0]
