"""PyG stays optional: ``import pytorch_zerocopy`` never imports it, and
``import pytorch_zerocopy.pyg`` without it says how to install it. Runs with or without PyG
installed (its absence is simulated in a child process)."""

import subprocess
import sys


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_package_does_not_import_pyg():
    r = run("import sys, pytorch_zerocopy, pytorch_zerocopy.graph, pytorch_zerocopy.sampling, "
            "pytorch_zerocopy.datasets\n"
            "assert 'torch_geometric' not in sys.modules, 'pytorch_zerocopy imported torch_geometric'\n")
    assert r.returncode == 0, r.stderr


def test_pyg_module_without_pyg_says_how_to_install_it():
    # None in sys.modules makes `import torch_geometric` raise ImportError, as when it is absent.
    r = run("import sys\n"
            "sys.modules['torch_geometric'] = None\n"
            "try:\n"
            "    import pytorch_zerocopy.pyg\n"
            "except ImportError as e:\n"
            "    print('ImportError:', e)\n"
            "else:\n"
            "    raise SystemExit('imported without torch_geometric')\n")
    assert r.returncode == 0, r.stderr
    assert "ImportError:" in r.stdout and "pip install torch-geometric" in r.stdout, r.stdout
