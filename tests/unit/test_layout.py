"""The layout is checked, not only described: CONTRIBUTING.md's module map names exactly the
modules that exist, and importing the core loads no adapter library (the import-linter
contracts of `make lint` state the rule; this shows it holds at run time)."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "src" / "cdi_gen"
#: Generated code, listed as one entry in the map.
GENERATED = "_proto/"


def _modules() -> set[str]:
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(GENERATED) or "__pycache__" in rel:
            continue
        found.add(rel)
    return found


def _mapped() -> set[str]:
    text = (REPO / "CONTRIBUTING.md").read_text()
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    return {m for m in re.findall(r"^\| `([^`]+)` \|", section, re.M) if m != GENERATED}


def test_module_map_lists_exactly_the_modules_that_exist() -> None:
    modules, mapped = _modules(), _mapped()
    assert not modules - mapped, f"modules missing from CONTRIBUTING.md: {sorted(modules - mapped)}"
    assert not mapped - modules, (
        f"CONTRIBUTING.md maps modules that do not exist: {sorted(mapped - modules)}"
    )


def _grpc_contract() -> configparser.SectionProxy:
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    return config["importlinter:contract:grpc"]


def test_the_grpc_contract_holds_every_module_but_the_generated_ones() -> None:
    """The contract lists what it holds, so a module it does not name is free to import grpc:
    every module is named (the package's own ``__init__``, which holds only the version,
    cannot be without the generated code under it)."""
    sources = _grpc_contract()["source_modules"].split()
    modules = {
        ".".join(("cdi_gen", *rel.removesuffix(".py").split("/"))).removesuffix(".__init__")
        for rel in _modules()
    } - {"cdi_gen"}
    free = {m for m in modules if not any(m == s or m.startswith(f"{s}.") for s in sources)}
    assert not free, f"the grpc contract of .importlinter does not hold {sorted(free)}"


def test_contributing_names_exactly_the_modules_the_grpc_contract_lets_import_grpc() -> None:
    """CONTRIBUTING.md's sentence "grpc ... only where a kubelet or CRI socket is spoken to
    (...)" lists the modules the contract lets through, no more and no fewer."""
    let_through = set()
    for line in _grpc_contract().get("ignore_imports", "").split("\n"):
        if line.strip():
            importer = line.split("->")[0].strip().removeprefix("cdi_gen.")
            package = importer.removesuffix(".*")
            let_through.add(package if package != importer else importer.replace(".", "/") + ".py")
    text = " ".join((REPO / "CONTRIBUTING.md").read_text().split("## Layout", 1)[1].split())
    sentence = re.search(
        r"grpc and the generated protos are imported only where a kubelet or CRI socket is "
        r"spoken to \(([^)]*)\)",
        text,
    )
    assert sentence, "CONTRIBUTING.md's Layout no longer says where grpc is imported"
    named = set(re.findall(r"`([^`]+)`", sentence.group(1)))
    assert named == let_through, (
        f"CONTRIBUTING.md names {sorted(named)}; .importlinter lets through {sorted(let_through)}"
    )


def _packages_that_list_their_modules() -> list[str]:
    """Packages whose docstring names one of their own modules (a list of what they hold,
    which must then be whole)."""
    out = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        package = ".".join(("cdi_gen", *init.parent.relative_to(PACKAGE).parts))
        if re.search(rf":\w+:`~?{re.escape(package)}\.\w+[.`]", init.read_text()):
            out.append(package)
    return out


@pytest.mark.parametrize("package", _packages_that_list_their_modules())
def test_a_package_that_lists_its_modules_lists_them_all(package: str) -> None:
    folder = PACKAGE.joinpath(*package.split(".")[1:])
    text = (folder / "__init__.py").read_text()
    # A module counts as named by any role: :mod:`~pkg.mod`, or :class:`~pkg.mod.Name`.
    named = set(re.findall(rf":\w+:`~?{re.escape(package)}\.(\w+)[.`]", text))
    present = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
    present |= {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
    assert present - named == set(), f"{package}'s docstring leaves out {sorted(present - named)}"
    assert named - present == set(), f"{package}'s docstring names {sorted(named - present)}"


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        ("cdi_gen.discovery.inventory", "pyudev"),
        ("cdi_gen.model", "pyudev"),
        ("cdi_gen.agent.agent", "pyudev"),
        ("cdi_gen.cdi.registry", "grpc"),
        ("cdi_gen.discovery.inventory", "grpc"),
        # The spec models are built when a spec is read, never to start.
        ("cdi_gen.agent.agent", "cdi_gen.cdi.spec"),
        # The CLI imports per command: `cdi-gen --help` and `render` must not load these.
        ("cdi_gen.cli.main", "pydantic"),
        ("cdi_gen.cli.main", "asyncio"),
        ("cdi_gen.cli.main", "pyudev"),
    ],
)
def test_importing_a_module_does_not_load_an_adapter_it_does_not_use(
    module: str, absent: str
) -> None:
    """The import contracts (`make lint`) in action: a fresh interpreter imports ``module``
    and the adapter library is not loaded (the agent imports udev only when it runs)."""
    code = f"import sys, {module}; print({absent!r} in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False", f"importing {module} loads {absent}"


#: Recorded hardware with an fpga, so that `render` goes the whole way to a printed spec.
_HARDWARE = REPO / "tests" / "data" / "udev" / "hardware.json"


def _render(prelude: str, report: str) -> str:
    """Run `cdi-gen render` of the recorded fpga in a fresh interpreter after ``prelude``;
    the value of the expression ``report`` once it ends. pydantic's plugin switch is left to
    the CLI, whatever the caller's environment says."""
    code = (
        "import sys\n"
        f"{prelude}"
        "from cdi_gen.cli.main import main\n"
        "try:\n"
        f"    main(['render', '--class', 'fpga', '--records', {str(_HARDWARE)!r}])\n"
        "finally:\n"
        f"    print('report:', {report}, file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert '"kind":"cdi-gen.io/fpga"' in proc.stdout.replace(" ", ""), proc.stdout[:200]
    return proc.stderr.splitlines()[-1].removeprefix("report: ")


@pytest.mark.parametrize(
    "absent",
    [
        "grpc",
        "cdi_gen.config.settings",
        "cdi_gen.cdi.registry",
        "cdi_gen.kubelet",
        "cdi_gen.cli.write",
        "cdi_gen.cli.doctor",
        # The udev monitor's loop and the spec models (built to read specs, never to
        # write them).
        "asyncio",
        "cdi_gen.cdi.spec",
    ],
)
def test_render_loads_only_what_it_uses(absent: str) -> None:
    """`cdi-gen render` prints a spec without the run settings, the spec folders' registry,
    anything of the kubelet's or the other commands' modules, the event loop or the spec
    models: each would cost it start-up time (issue 21)."""
    assert _render("", f"{absent!r} in sys.modules") == "False", f"render loads {absent}"


def test_the_cli_skips_pydantics_plugin_scan() -> None:
    """pydantic reads every installed distribution's entry points at its first model unless
    told not to: the CLI tells it, and render reads none (issue 21)."""
    prelude = (
        "import importlib.metadata\n"
        "calls = []\n"
        "real = importlib.metadata.entry_points\n"
        "importlib.metadata.entry_points = lambda **kw: calls.append(kw) or real(**kw)\n"
    )
    assert _render(prelude, "len(calls)") == "0"


def test_every_command_module_is_a_command_of_the_group() -> None:
    """The group imports a command's module only when it runs, from its table: a command
    module missing from the table would be a command nobody can call."""
    from cdi_gen.cli.main import COMMANDS, cli

    helpers = {"__init__.py", "main.py", "options.py", "inputs.py"}
    modules = {p.stem for p in (PACKAGE / "cli").glob("*.py") if p.name not in helpers}
    assert {module.rsplit(".", 1)[1] for module, _ in COMMANDS.values()} == modules
    for name in COMMANDS:
        command = cli.get_command(None, name)  # type: ignore[arg-type]
        assert command is not None and command.name == name


#: The DRA driver's rooms stay small (issue 54): no class over this many lines, no function
#: over the second.
DRA_MAX_CLASS_LINES, DRA_MAX_FUNCTION_LINES = 250, 60


def test_no_class_or_function_of_dra_is_over_its_size() -> None:
    import ast

    over = []
    for path in sorted((PACKAGE / "dra").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                limit = DRA_MAX_CLASS_LINES
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                limit = DRA_MAX_FUNCTION_LINES
            else:
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                over.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {lines}")
    assert not over, f"over {DRA_MAX_CLASS_LINES}/{DRA_MAX_FUNCTION_LINES} lines: {over}"
