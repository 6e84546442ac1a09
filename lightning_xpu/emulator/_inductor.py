"""torch.compile's default backend (inductor) on the emulated XPU.

On an Intel GPU, inductor generates Triton kernels for xpu tensors (Intel's Triton backend, ``pytorch-triton-xpu``).
The emulated device's memory is host memory, so here inductor's own CPU backend (C++ kernels from ``CppScheduling``)
generates the fused kernels for ``"xpu"`` instead, registered through inductor's ``register_backend_for_device``.
Everything above code generation stays inductor's XPU path: Dynamo's guards on xpu tensors, AOTAutograd, the
decompositions and lowerings inductor picks for a GPU device, the device guard and stream of the wrapper, and the
extern kernels (``mm``, convolution, SDPA, ...), which are aten calls through the emulator's operator table.

Each fused kernel is launched as a device kernel is: on the current stream of its device (the stream sanitizer
sees its reads and writes), refusing host memory as Intel's Triton launcher does, and refusing fp64 on devices
without it. Installed lazily: :func:`install_when_imported` waits for ``torch._inductor.compile_fx`` (imported by the
first compilation with inductor), so a process that never compiles never imports inductor because of the emulator.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

# imported when inductor compiles its first graph (torch._dynamo's "inductor" backend, torch._inductor.compile_fx())
_TRIGGER = "torch._inductor.compile_fx"
# the name the generated wrappers call fused kernels through (see EmulatedXPUWrapper)
_LAUNCH = "emulated_xpu_launch"
# DTYPE_TO_CPP of inductor's C++ backend writes float64 as `double` (and complex128 as `at::complex<double>`)
_FP64_IN_CPP = re.compile(r"\bdouble\b")

_installed: list[bool] = []


def install_when_imported() -> None:
    """Install the backend once ``torch._inductor.compile_fx`` is imported (now, if it already is)."""
    from lightning_xpu.emulator._startup import run_after_import

    run_after_import(_TRIGGER, install)


def install() -> None:
    """Register inductor's C++ backend for ``"xpu"`` (idempotent)."""
    if _installed:
        return
    from torch._inductor import config, scheduler
    from torch._inductor.codegen import common
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
    from torch._inductor.custom_graph_pass import CustomGraphModulePass

    wrapper, _ = _wrapper_classes(PythonWrapperCodegen, SubgraphPythonWrapperCodegen)

    source_digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()

    class CacheKey(CustomGraphModulePass):
        """Changes nothing; its uuid puts this module's source into the key of inductor's caches, so that a cached
        graph compiled by another version of the emulated backend is never loaded."""

        def __call__(self, gm: Any) -> None:
            return None

        def uuid(self) -> str:
            return source_digest

    common.register_backend_for_device(
        "xpu", CppScheduling, wrapper, _NoCppWrapper, _NoCppWrapper, device_custom_pass=CacheKey()
    )
    # torch internals (inductor's scheduler, torch 2.13): inductor keeps "xpu" a GPU type (utils.GPU_TYPES), so
    # lowering, decompositions, device guards and streams stay those of an Intel GPU; only the scheduler's questions
    # about how to generate code (SIMD groups or C++ loops, loop merging, fusion) get the CPU's answers.
    original_is_gpu = scheduler.BaseSchedulerNode.is_gpu

    def is_gpu(self: Any) -> bool:
        device = self.get_device()
        return device is not None and device.type != "xpu" and original_is_gpu(self)

    def is_cpu(self: Any) -> bool:
        device = self.get_device()
        return device is not None and device.type in ("cpu", "xpu")

    scheduler.BaseSchedulerNode.is_gpu = is_gpu
    scheduler.BaseSchedulerNode.is_cpu = is_cpu
    original_create_backend = scheduler.Scheduler.create_backend

    def create_backend(self: Any, device: Any) -> Any:
        if device.type != "xpu":
            return original_create_backend(self, device)
        # torch internals: as Scheduler.create_backend, without its Triton check (TritonMissing for a GPU type)
        from torch._inductor.virtualized import V

        V.graph.add_device_info(device)
        return common.get_scheduling_for_device("xpu")(self)

    scheduler.Scheduler.create_backend = create_backend
    # utils.get_current_backend("xpu") answers config.xpu_backend: the C++ code generator asks it
    config.xpu_backend = "cpp"
    _installed.append(True)


class _Refused(type):
    """Any use of the class raises: inductor reads attributes of a wrapper class before creating one."""

    def __getattr__(cls, name: str) -> Any:
        raise RuntimeError(
            "The emulated XPU runs torch.compile with inductor's Python wrapper only: "
            "torch._inductor.config.cpp_wrapper, fx_wrapper and AOTInductor (torch._inductor.aoti_compile_and_package) "
            "are not emulated. Leave them off on the emulator; they run on a real Intel GPU."
        )


class _NoCppWrapper(metaclass=_Refused):
    """inductor's C++ wrapper (``cpp_wrapper=True``, AOTInductor) and FX wrapper for xpu: not emulated."""


def _wrapper_classes(python_wrapper: type, subgraph_wrapper: type) -> tuple[type, type]:
    """The Python wrappers for xpu graphs: inductor's, with fused kernels launched through :func:`launch`."""

    class Mixin:
        def write_header(self) -> None:
            super().write_header()  # type: ignore[misc]
            # torch._C._dynamo.guards._empty_strided_xpu exists only in XPU builds of torch; this allocates the same
            # way, on the current device (which the wrapper's device guard sets)
            self.header.writeline(  # type: ignore[attr-defined]
                "empty_strided_xpu = lambda size, stride, dtype: "
                "torch.empty_strided(size, stride, dtype=dtype, device='xpu')"
            )
            self.imports.writeline(f"from {__name__} import launch as {_LAUNCH}")  # type: ignore[attr-defined]

        def define_kernel(self, kernel_name: str, kernel_body: str, *args: Any, **kwargs: Any) -> None:
            _kernel_uses_fp64(self).setdefault(kernel_name, _uses_fp64(kernel_body))
            super().define_kernel(kernel_name, kernel_body, *args, **kwargs)  # type: ignore[misc]

        def _generate_kernel_call_helper(
            self, kernel_name: str, call_args: list[Any], *, triton: bool = True, **kwargs: Any
        ) -> None:
            from torch._inductor.virtualized import V

            device = kwargs.get("device") or V.graph.get_current_device_or_throw()
            if triton or device.type != "xpu":
                super()._generate_kernel_call_helper(  # type: ignore[misc]
                    kernel_name, call_args, triton=triton, **kwargs
                )
                return
            arg_types = kwargs.get("arg_types") or []
            writes = tuple(i for i, t in enumerate(arg_types) if _is_written(str(t)))
            names = tuple(str(a) for a in call_args)
            fp64 = _kernel_uses_fp64(self).get(kernel_name, False)
            self.writeline(  # type: ignore[attr-defined]
                f"{_LAUNCH}({kernel_name}, {kernel_name!r}, {names!r}, {writes!r}, {fp64!r}, "
                f"{', '.join(names)}{',' if len(names) == 1 else ''})"
            )

    class EmulatedXPUWrapper(Mixin, python_wrapper):  # type: ignore[misc, valid-type]
        @staticmethod
        def create(is_subgraph: bool, subgraph_name: Any, parent_wrapper: Any, partition_signatures: Any = None) -> Any:
            if is_subgraph:
                return EmulatedXPUSubgraphWrapper(subgraph_name, parent_wrapper, partition_signatures)
            return EmulatedXPUWrapper()

    class EmulatedXPUSubgraphWrapper(Mixin, subgraph_wrapper):  # type: ignore[misc, valid-type]
        pass

    return EmulatedXPUWrapper, EmulatedXPUSubgraphWrapper


def _kernel_uses_fp64(wrapper: Any) -> dict[str, bool]:
    if not hasattr(wrapper, "_emulated_xpu_fp64"):
        wrapper._emulated_xpu_fp64 = {}
    return wrapper._emulated_xpu_fp64


def _is_written(arg_type: str) -> bool:
    """A pointer argument the C++ kernel writes (inductor declares the ones it only reads ``const``)."""
    return arg_type.endswith("*") and not arg_type.startswith("const")


def _uses_fp64(kernel_source: str) -> bool:
    """Whether the kernel's body computes in or converts to fp64 (its parameter list aside: a 0-dim CPU fp64 tensor,
    Dynamo's wrapper of a Python float, reaches a Triton kernel as a scalar instead)."""
    start = kernel_source.find('extern "C"')
    body = kernel_source[kernel_source.find("{", start) :] if start >= 0 else kernel_source
    return bool(_FP64_IN_CPP.search(body))


def launch(kernel: Any, name: str, arg_names: tuple[str, ...], writes: tuple[int, ...], fp64: bool, *args: Any) -> None:
    """Run a fused kernel as the device would: check its arguments, enqueue it on the current stream of its device
    (the stream sanitizer sees its reads and writes), then run the C++ kernel on the host memory."""
    import torch

    from lightning_xpu.emulator import _runtime

    tensors, written, names = [], [], []
    for i, (arg, arg_name) in enumerate(zip(args, arg_names, strict=True)):
        if not isinstance(arg, torch.Tensor):
            continue
        if arg.device.type == "xpu":
            tensors.append(arg)
            written.append(i in writes)
            names.append(arg_name)
            fp64 = fp64 or arg.dtype in (torch.float64, torch.complex128)
        elif arg.dim() > 0 and not arg.is_pinned():
            # Intel's Triton launcher (third_party/intel/backend/driver.py, checkDevicePointer) asks Level Zero
            # about every pointer argument; pageable host memory is unknown to it. A 0-dim CPU tensor is a scalar
            # argument there (the wrapper passes its value), never a pointer.
            raise ValueError(f"Pointer argument (at {i}) doesn't reference accessible memory.")
    prof = _runtime.profile()
    if fp64 and not prof.has_fp64:
        raise RuntimeError(
            f"Required aspect fp64 is not supported on the device ({prof.name} has no native fp64; compiled kernel "
            f"{name} computes in fp64). Keep fp64 out of compiled code on this device: use float32."
        )
    _runtime.native().launch_kernel(name, tensors[0].device.index if tensors else -1, tensors, written, names)
    kernel(*args)
