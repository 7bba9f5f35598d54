"""An installed wheel (not only an editable checkout) carries the catalogs and finds them."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_bundles_catalogs_and_loader_finds_them(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next(tmp_path.glob("servingmath-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(tmp_path / "site")
    for needed in (
        "perfmodel/data/hardware.csv",
        "perfmodel/data/prices.csv",
        "perfmodel/data/models.csv",
        "perfmodel/data/models/meta-llama--Llama-3.1-70B.json",
        "servingmath/cli.py",
    ):
        assert needed in names, needed
    # Import from the unpacked wheel only (not the checkout) and load a model and a GPU.
    code = (
        "import perfmodel, sys; "
        "assert 'site' in perfmodel.__file__, perfmodel.__file__; "
        "print(perfmodel.data_dir()); "
        "m = perfmodel.load_model('llama-3.1-70b'); h = perfmodel.load_hardware('h100-sxm'); "
        "print(float(perfmodel.kv_bytes_per_token(m, 2.0)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.split()
    assert out[0] == str(tmp_path / "site" / "perfmodel" / "data")
    assert float(out[1]) == 327680.0
