"""Test-wide set-up: the two tiers, a clean skip without Triton, a fresh reported seed per run,
and NaN-poisoned allocations.

Tiers (markers registered in pyproject.toml; ``interpreter`` is assigned here, so test files need
no marks):

- default: validation, the ops on the torch path, layers, models, the bench harness;
  ``pytest -m "not interpreter and not gpu"`` (minutes on a 2-core CPU).
- ``interpreter``: tests that run the Triton kernels (in Triton's interpreter without a GPU):
  every test in a module named ``test_triton*`` or under ``tests/gpu/``, or in a module that
  imports Triton code (Triton itself or a module of ``linrnn.engine`` that imports it, directly
  or through its own imports);
  every test parametrized with the value ``"triton"`` (``backend="triton"``); every test whose
  skip condition names Triton.
- ``gpu``: marked in the test file (``@pytest.mark.gpu``: the checks of ``tests/gpu/`` that need
  a device); skipped here without CUDA. The rest of ``tests/gpu/`` (the checks' machinery at tiny
  shapes) is in the interpreter tier.

Without Triton, a test module whose import needs it is reported as skipped (not as a collection
error), and the ``interpreter`` tests of the other modules are skipped with the same reason.
``scripts/test.sh`` runs the tiers.
"""

from __future__ import annotations

import fnmatch
import os
import random
import sys
import types
import zlib
from pathlib import Path

import pytest
import torch

# Without a GPU the Triton kernels run in Triton's interpreter (it must be chosen before triton
# is first imported, which linrnn does).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Fresh randomness each run, reproducible from the header: LINRNN_TEST_SEED=<n> pytest ...
# (set in the environment here, so that pytest-xdist's workers, started after this import, take
# the same seed as the process that reports it)
os.environ.setdefault("LINRNN_TEST_SEED", str(random.SystemRandom().randrange(2**31)))
SESSION_SEED = int(os.environ["LINRNN_TEST_SEED"])

TESTS = Path(__file__).resolve().parent
INTERPRETER_MODULES = ("test_triton*.py",)  # file-name patterns of whole-module Triton tests
# Folders whose tests run the Triton kernels: the device checks' machinery at tiny shapes
# (their ``gpu`` tests skip without CUDA instead).
INTERPRETER_DIRS = (TESTS / "gpu",)
# Packages whose modules are followed when asking "does this import Triton?" (the test folder's
# own helper modules are followed too).
FOLLOWED_PACKAGES = ("linrnn.engine",)


def _triton_missing_reason() -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"needs Triton (`import triton` failed: {exc})"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "needs Triton with a GPU or TRITON_INTERPRET=1"
    return None


TRITON_MISSING = _triton_missing_reason()


# ------------------------------------------------------------------------------------------
# Triton's interpreter: no second patching of triton.language inside a launch

# Triton 3.9's interpreter patches triton.language (tl and tl.core: every builtin wrapped for
# its NumPy semantic) once per launch, restoring it after, and again at every call of a
# @triton.jit helper inside the kernel, where it finds the same modules already patched: a
# walk over the modules' members (inspect.getmembers) that only sets again what the launch has
# set. In helper-heavy kernels that walk was most of the time (the fp32 GLA call with gv of
# test_diagonal_walk_matches_reference, forward and backward: 6.1 s, 2.8 s without it). The
# helper calls below skip it when the launch has already patched every language module the
# helper's globals name (Triton's own call patches the others, and leaves them patched);
# otherwise, or where Triton's code is not the form this was written against, Triton's call
# runs. The kernels run the same interpreted operations either way (bitwise the same results).
_DEVICE_CALL_SOURCE = """
    def __call__(self, *args, **kwargs):
        # This is a device function call
        _patch_lang(self.fn)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise InterpreterError(repr(e)) from e
"""


def _patch_interpreter_once_per_launch() -> None:
    import inspect

    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    device_call = interpreter.InterpretedFunction.__call__
    grid_call = interpreter.GridExecutor.__call__
    try:
        source = inspect.getsource(device_call)
    except (OSError, TypeError):
        return
    if source.strip() != _DEVICE_CALL_SOURCE.strip() or "_patch_lang(self.fn)" not in (
        inspect.getsource(grid_call)
    ):
        return
    patched: list[frozenset] = []  # per active launch: the language modules it patched
    langs_of: dict = {}

    def langs(fn) -> frozenset:
        if fn not in langs_of:
            found = (v for v in fn.__globals__.values() if inspect.ismodule(v))
            langs_of[fn] = frozenset(id(v) for v in found if v in (tl, tl.core))
        return langs_of[fn]

    def launch(self, *args, **kwargs):
        patched.append(langs(self.fn))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    def helper_call(self, *args, **kwargs):
        if not patched:
            return device_call(self, *args, **kwargs)
        if not langs(self.fn) <= patched[-1]:  # Triton's call patches them (till the end)
            result = device_call(self, *args, **kwargs)
            patched[-1] |= langs(self.fn)
            return result
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    interpreter.GridExecutor.__call__ = launch
    interpreter.InterpretedFunction.__call__ = helper_call


if TRITON_MISSING is None and os.environ.get("TRITON_INTERPRET") == "1":
    _patch_interpreter_once_per_launch()


def pytest_report_header(config):
    lines = [f"linrnn test seed: {SESSION_SEED} (rerun with LINRNN_TEST_SEED={SESSION_SEED})"]
    if TRITON_MISSING:
        lines.append(f"Triton tests skipped: {TRITON_MISSING}")
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # Also at the end, where -q output (and CI logs) keep it.
    terminalreporter.write_line(f"linrnn test seed: {SESSION_SEED} (LINRNN_TEST_SEED to rerun)")


# ------------------------------------------------------------------------------------------
# A module whose import fails for want of Triton is skipped, not an error


def _is_missing_triton(exc: BaseException | None) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "triton":
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class _TritonOptionalModule(pytest.Module):
    def collect(self):
        try:
            _ = self.obj  # imports the test module
        except self.CollectError as exc:
            if _is_missing_triton(exc.__cause__):
                pytest.skip(f"{self.path.name}: {TRITON_MISSING}", allow_module_level=True)
            raise
        return super().collect()


def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name == "__init__.py":
        return None  # the default collector
    return _TritonOptionalModule.from_parent(parent, path=module_path)


# ------------------------------------------------------------------------------------------
# Tiers


def _module_of(value) -> types.ModuleType | None:
    if isinstance(value, types.ModuleType):
        return value
    name = getattr(value, "__module__", None)
    return sys.modules.get(name) if isinstance(name, str) else None


def _is_followed(module: types.ModuleType) -> bool:
    if module.__name__.startswith(tuple(p + "." for p in FOLLOWED_PACKAGES)):
        return True
    path = getattr(module, "__file__", None)
    return path is not None and TESTS in Path(path).resolve().parents


def _imports_triton(module: types.ModuleType, memo: dict[str, bool]) -> bool:
    """Whether ``module`` reaches Triton through its globals (modules, or the modules of the
    functions and classes it imported), following only the followed modules."""
    stack, seen = [module], {module.__name__}
    while stack:
        current = stack.pop()
        if memo.get(current.__name__):
            memo[module.__name__] = True
            return True
        for value in list(vars(current).values()):
            used = _module_of(value)
            if used is None or used.__name__ in seen:
                continue
            if used.__name__.split(".")[0] == "triton":
                memo[module.__name__] = True
                return True
            if _is_followed(used) and memo.get(used.__name__) is not False:
                seen.add(used.__name__)
                stack.append(used)
    for name in seen:  # nothing they reach is Triton
        memo[name] = False
    return False


def _uses_triton_backend(item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return False
    if any(isinstance(v, str) and v == "triton" for v in callspec.params.values()):
        return True
    return "triton" in callspec.id.split("-")


def _skip_names_triton(item) -> bool:
    for mark in item.iter_markers("skipif"):
        if "triton" in str(mark.kwargs.get("reason", "")).lower():
            return True
    return False


def pytest_collection_modifyitems(config, items):
    memo: dict[str, bool] = {}
    by_module: dict[str, bool] = {}
    for item in items:
        path = Path(str(item.path)).resolve()
        if item.get_closest_marker("gpu") and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        module = getattr(item, "module", None)
        key = str(path)
        if key not in by_module:
            by_module[key] = (
                any(fnmatch.fnmatch(path.name, p) for p in INTERPRETER_MODULES)
                or any(d in path.parents for d in INTERPRETER_DIRS)
                or (module is not None and _imports_triton(module, memo))
            )
        if (
            by_module[key]
            or item.get_closest_marker("interpreter")
            or _uses_triton_backend(item)
            or _skip_names_triton(item)
        ):
            item.add_marker(pytest.mark.interpreter)
            if TRITON_MISSING:
                item.add_marker(pytest.mark.skip(reason=TRITON_MISSING))


# ------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(autouse=True)
def _seed(request):
    """Seed torch per test from the session seed and the test id."""
    torch.manual_seed(SESSION_SEED ^ zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _poison_empty(monkeypatch):
    """Fill every uninitialized floating-point allocation with NaN (fla's trick), so an output
    element that a code path forgets to write shows up as NaN instead of stale memory."""
    real_empty, real_empty_like, real_new_empty = (
        torch.empty,
        torch.empty_like,
        torch.Tensor.new_empty,
    )

    def poison(t):
        if t.dtype.is_floating_point or t.dtype.is_complex:
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poison(real_empty_like(*a, **k)))
    monkeypatch.setattr(
        torch.Tensor, "new_empty", lambda self, *a, **k: poison(real_new_empty(self, *a, **k))
    )
