"""The `vramledger run` machinery, with stand-in `torch` and `vramledger` packages: these tests
need neither torch nor a GPU. They check that the startup hook installs right after `import
torch` completes (before user code can allocate), never imports torch itself, keeps the
program's own sitecustomize, reports at exit, and fails loudly when installing fails."""

import os
import subprocess
import sys
import textwrap

from conftest import REPO

BOOTSTRAP = os.path.join(REPO, "python", "vramledger", "_bootstrap")
PACKAGE_ROOT = os.path.join(REPO, "python")


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def _fake_packages(tmp_path, install_body="pass"):
    fake = tmp_path / "fake"
    _write(fake / "torch" / "__init__.py", """
        import os
        with open(os.environ["MARK"], "a") as handle:
            handle.write("torch imported\\n")
        ready = True  # set last: install must see a fully imported torch
    """)
    _write(fake / "vramledger" / "__init__.py", f"""
        import os
        def install(conf):
            import torch
            assert torch.ready, "installed before torch finished importing"
            {install_body}
            with open(os.environ["MARK"], "a") as handle:
                handle.write(f"installed [{{conf}}]\\n")
        def report():
            return "REPORT TEXT\\n"
        def used_devices():
            return [0, 1]
        def process_report(device=None, format="text"):
            return f"PROCESS REPORT device {{device}}\\n"
    """)
    return fake


def _run(code, tmp_path, fake, extra_paths=(), **env_extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP, str(fake), *map(str, extra_paths)])
    env["MARK"] = str(tmp_path / "mark.txt")
    env["VRAMLEDGER_AUTOINSTALL"] = "1"
    env.pop("VRAMLEDGER_REPORT", None)
    env.pop("VRAMLEDGER_PROCESS_REPORT", None)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=60)


def _mark(tmp_path):
    path = tmp_path / "mark.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_installs_right_after_torch_import(tmp_path):
    fake = _fake_packages(tmp_path)
    result = _run("""
        import os
        import torch
        with open(os.environ["MARK"], "a") as handle:
            handle.write("user code\\n")
    """, tmp_path, fake, VRAMLEDGER_CONF="backend:vmm")
    assert result.returncode == 0, result.stderr
    assert _mark(tmp_path) == ["torch imported", "installed [backend:vmm]", "user code"]


def test_programs_without_torch_are_untouched(tmp_path):
    fake = _fake_packages(tmp_path)
    result = _run("import sys; print('torch' in sys.modules, 'vramledger' in sys.modules)",
                  tmp_path, fake)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False False"
    assert _mark(tmp_path) == []


def test_a_backend_the_program_chose_is_kept(tmp_path):
    # torch's own test_allocator_backend: a program that sets backend:cudaMallocAsync before
    # importing torch gets torch's cudaMallocAsync allocator, with one line saying so.
    fake = _fake_packages(tmp_path)
    result = _run("""
        import os
        os.environ["PYTORCH_ALLOC_CONF"] = "max_split_size_mb:20,backend:cudaMallocAsync"
        import torch
    """, tmp_path, fake)
    assert result.returncode == 0, result.stderr
    assert _mark(tmp_path) == ["torch imported"]
    assert "selects backend:cudaMallocAsync" in result.stderr
    # backend:native is torch's default allocator, which vramledger replaces as usual ...
    fake = _fake_packages(tmp_path / "native")
    result = _run("import torch", tmp_path / "native", fake,
                  PYTORCH_CUDA_ALLOC_CONF="backend:native")
    assert result.returncode == 0, result.stderr
    assert _mark(tmp_path / "native") == ["torch imported", "installed []"]
    # ... and the override installs vramledger whatever the program chose.
    fake = _fake_packages(tmp_path / "override")
    result = _run("import torch", tmp_path / "override", fake,
                  PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync",
                  VRAMLEDGER_OVERRIDE_BACKEND="1")
    assert result.returncode == 0, result.stderr
    assert _mark(tmp_path / "override") == ["torch imported", "installed []"]


def test_hook_is_inert_without_autoinstall(tmp_path):
    fake = _fake_packages(tmp_path)
    result = _run("import torch", tmp_path, fake, VRAMLEDGER_AUTOINSTALL="0")
    assert result.returncode == 0, result.stderr
    assert _mark(tmp_path) == ["torch imported"]


def test_shadowed_sitecustomize_still_runs(tmp_path):
    fake = _fake_packages(tmp_path)
    other = tmp_path / "other"
    _write(other / "sitecustomize.py", """
        import os
        with open(os.environ["MARK"], "a") as handle:
            handle.write("program's sitecustomize\\n")
    """)
    result = _run("import torch", tmp_path, fake, extra_paths=[other])
    assert result.returncode == 0, result.stderr
    assert _mark(tmp_path) == ["program's sitecustomize", "torch imported", "installed []"]


def test_report_at_exit(tmp_path):
    fake = _fake_packages(tmp_path)
    report = tmp_path / "report.txt"
    result = _run("import torch", tmp_path, fake, VRAMLEDGER_REPORT=str(report))
    assert result.returncode == 0, result.stderr
    assert "REPORT TEXT" in report.read_text()
    result = _run("import torch", tmp_path, fake, VRAMLEDGER_REPORT="stderr")
    assert "REPORT TEXT" in result.stderr


def test_failed_install_fails_the_import(tmp_path):
    fake = _fake_packages(tmp_path, install_body="raise RuntimeError('refused for a reason')")
    result = _run("import torch\nprint('should not get here')", tmp_path, fake)
    assert result.returncode != 0
    assert "refused for a reason" in result.stderr
    assert "should not get here" not in result.stdout


def test_cli_run_sets_up_the_environment(tmp_path):
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        from vramledger.cli import main
        main(["run", "--conf", "backend:cuda_malloc", "--report", "--", sys.executable, "-c",
              "import os; print(os.environ['VRAMLEDGER_CONF'], os.environ['VRAMLEDGER_AUTOINSTALL'],"
              " os.environ['VRAMLEDGER_REPORT'], os.environ['PYTHONPATH'].split(os.pathsep)[0])"])
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMLEDGER_")}
    result = subprocess.run([sys.executable, "-c", code, PACKAGE_ROOT], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    conf, autoinstall, report, first_path = result.stdout.split()
    assert (conf, autoinstall, report) == ("backend:cuda_malloc", "1", "stderr")
    assert os.path.samefile(first_path, BOOTSTRAP)


def test_cli_run_without_command_is_an_error():
    code = "import sys; sys.path.insert(0, sys.argv[1]); from vramledger.cli import main; sys.exit(main(['run', '--']))"
    result = subprocess.run([sys.executable, "-c", code, PACKAGE_ROOT], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert "no command given" in result.stderr


def test_process_report_at_exit_for_every_device_used(tmp_path):
    fake = _fake_packages(tmp_path)
    result = _run("import torch", tmp_path, fake, VRAMLEDGER_PROCESS_REPORT="stderr")
    assert result.returncode == 0, result.stderr
    assert "PROCESS REPORT device 0\nPROCESS REPORT device 1\n" in result.stderr
    assert "REPORT TEXT" not in result.stderr  # --report is separate
    report = tmp_path / "process.txt"
    result = _run("import torch", tmp_path, fake, VRAMLEDGER_PROCESS_REPORT=str(report))
    assert result.returncode == 0, result.stderr
    assert "PROCESS REPORT device 1" in report.read_text()
    # Without torch nothing is installed and nothing is printed.
    result = _run("pass", tmp_path, fake, VRAMLEDGER_PROCESS_REPORT="stderr")
    assert "PROCESS REPORT" not in result.stderr


_PRINT_ENV = ("import os; print(os.environ.get('VRAMLEDGER_PROCESS_REPORT', '-'), "
              "repr((os.environ.get('LD_PRELOAD', '-'), "
              "os.environ.get('VRAMLEDGER_PRELOAD_ROUTE', '-'))))")


def _cli(args, tmp_path, **env_extra):
    """Runs vramledger.cli.main(args + [python, -c, _PRINT_ENV]) from the source tree; returns
    (returncode, the child's VRAMLEDGER_PROCESS_REPORT, its LD_PRELOAD, stderr)."""
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        from vramledger.cli import main
        sys.exit(main(sys.argv[2:]))
    """)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VRAMLEDGER_") and k != "LD_PRELOAD"}
    env.update(env_extra)
    command = [sys.executable, "-c", code, PACKAGE_ROOT, *args, "--", sys.executable, "-c",
               _PRINT_ENV]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)
    if result.returncode != 0 or not result.stdout.strip():
        return result.returncode, None, None, result.stderr
    report, rest = result.stdout.split(" ", 1)
    preload, route = eval(rest)
    _cli.last_route = route  # VRAMLEDGER_PRELOAD_ROUTE the child saw
    return result.returncode, report, preload, result.stderr


def _fake_shim(path):
    # Not a real library: the dynamic loader warns and ignores it, which is all these tests need.
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return str(path)


def test_cli_report_on_exit(tmp_path):
    assert _cli(["run", "--report-on-exit"], tmp_path)[:2] == (0, "stderr")
    assert _cli(["run", "--report-on-exit", "out.txt"], tmp_path)[:2] == (0, "out.txt")
    assert _cli(["run"], tmp_path)[:2] == (0, "-")


def test_cli_tracks_non_torch_by_default_when_the_shim_is_found(tmp_path):
    shim = _fake_shim(tmp_path / "lib" / "libvramledger_preload.so")
    rc, _, preload, err = _cli(["run"], tmp_path, VRAMLEDGER_PRELOAD_LIBRARY=shim)
    assert rc == 0, err
    assert preload == shim
    # Prepended to what the user preloads, once.
    rc, _, preload, err = _cli(["run", "--track-non-torch"], tmp_path,
                               VRAMLEDGER_PRELOAD_LIBRARY=shim,
                               LD_PRELOAD=f"/x/libother.so:{shim}")
    assert rc == 0, err
    assert preload == f"{shim} /x/libother.so"
    # Turned off: LD_PRELOAD untouched.
    rc, _, preload, err = _cli(["run", "--no-track-non-torch"], tmp_path,
                               VRAMLEDGER_PRELOAD_LIBRARY=shim, LD_PRELOAD="/x/libother.so")
    assert rc == 0, err
    assert preload == "/x/libother.so"


def test_cli_finds_the_shim_in_the_build_tree_of_the_plugin(tmp_path):
    build = tmp_path / "build"
    plugin = build / "torch_plugin" / "libvramledger_torch.so"
    _fake_shim(plugin)
    shim = _fake_shim(build / "preload" / "libvramledger_preload.so")
    rc, _, preload, err = _cli(["run"], tmp_path, VRAMLEDGER_LIBRARY=str(plugin))
    assert rc == 0, err
    assert preload == shim


def test_cli_without_the_shim(tmp_path):
    # Not found: off by default, an error when asked for.
    rc, _, preload, err = _cli(["run"], tmp_path)
    assert rc == 0, err
    assert preload == "-"
    rc, _, _, err = _cli(["run", "--track-non-torch"], tmp_path)
    assert rc == 2
    assert "--track-non-torch: libvramledger_preload.so not found" in err
    rc, _, _, err = _cli(["run", "--track-non-torch"], tmp_path,
                         VRAMLEDGER_PRELOAD_LIBRARY=str(tmp_path / "missing.so"))
    assert rc == 2
    assert "missing.so" in err
    rc, _, preload, err = _cli(["run"], tmp_path,
                               VRAMLEDGER_PRELOAD_LIBRARY=str(tmp_path / "missing.so"))
    assert rc == 0, err
    assert preload == "-"
    assert "missing.so not found: non-torch memory is not tracked" in err


def test_cli_route_non_torch(tmp_path):
    shim = _fake_shim(tmp_path / "lib" / "libvramledger_preload.so")
    # Default set, a given set, and off unless asked for.
    rc, _, preload, err = _cli(["run", "--route-non-torch"], tmp_path,
                               VRAMLEDGER_PRELOAD_LIBRARY=shim)
    assert rc == 0, err
    assert (preload, _cli.last_route) == (shim, "1")
    rc, _, preload, err = _cli(["run", "--route-non-torch", "cublas,user"], tmp_path,
                               VRAMLEDGER_PRELOAD_LIBRARY=shim)
    assert rc == 0, err
    assert (preload, _cli.last_route) == (shim, "cublas,user")
    rc, _, preload, err = _cli(["run"], tmp_path, VRAMLEDGER_PRELOAD_LIBRARY=shim)
    assert rc == 0, err
    assert (preload, _cli.last_route) == (shim, "-")
    # Routing needs the shim: refused without it, and with --no-track-non-torch.
    rc, _, _, err = _cli(["run", "--route-non-torch"], tmp_path)
    assert rc == 2
    assert "--route-non-torch: libvramledger_preload.so not found" in err
    rc, _, _, err = _cli(["run", "--route-non-torch", "--no-track-non-torch"], tmp_path,
                         VRAMLEDGER_PRELOAD_LIBRARY=shim)
    assert rc == 2
    assert "--route-non-torch needs the shim" in err


def test_a_plugin_built_for_another_torch_refuses_to_load(monkeypatch):
    # The package compares the torch it was built for with the one imported before it loads any
    # native code (a vtable of another release would be called wrongly).
    import importlib
    import types

    import pytest

    monkeypatch.syspath_prepend(PACKAGE_ROOT)
    for name in [m for m in sys.modules if m == "vramledger" or m.startswith("vramledger.")]:
        monkeypatch.delitem(sys.modules, name)
    package = importlib.import_module("vramledger")
    built = types.ModuleType("vramledger._build_info")
    built.TORCH_VERSION = "2.15.0+cu130"
    monkeypatch.setitem(sys.modules, "vramledger._build_info", built)
    package._check_torch_release("2.15.1")  # same release line: fine
    package._check_torch_release("2.15.0+cpu")
    with pytest.raises(ImportError, match=r"built for torch 2\.15\.0\+cu130 but torch 2\.11\.0 "
                                          r"is imported.*Rebuild"):
        package._check_torch_release("2.11.0")
    with pytest.raises(ImportError):
        package._check_torch_release("2.1.0")
