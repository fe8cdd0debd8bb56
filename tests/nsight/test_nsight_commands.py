"""The exact nsys / ncu command lines opscope runs, kernel names as the tools print them, and the one-line
diagnoses of the tools' known failures. Torch-free, no GPU or Nsight needed."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from opscope.errors import NsightError
from opscope.nsight import commands
from opscope.nsight.commands import (
    NCU_METRICS,
    diagnose,
    kernel_base_name,
    kernel_key,
    kernel_regex,
    ncu_import_command,
    ncu_profile_command,
    nsys_export_command,
    nsys_profile_command,
    require_tools,
    split_tool_args,
)

METRICS = ("gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,"
           "sm__sass_thread_inst_executed_op_ffma_pred_on.sum,sm__sass_thread_inst_executed_op_fadd_pred_on.sum,"
           "sm__sass_thread_inst_executed_op_fmul_pred_on.sum,sm__sass_thread_inst_executed_op_hfma_pred_on.sum,"
           "sm__sass_thread_inst_executed_op_hadd_pred_on.sum,sm__sass_thread_inst_executed_op_hmul_pred_on.sum,"
           "sm__sass_thread_inst_executed_op_dfma_pred_on.sum,sm__sass_thread_inst_executed_op_dadd_pred_on.sum,"
           "sm__sass_thread_inst_executed_op_dmul_pred_on.sum,sm__inst_executed_pipe_tensor.sum,"
           "dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed")


def test_nsys_profile_command_is_the_documented_one():
    cmd = nsys_profile_command("/opt/nsys/bin/nsys", Path("/tmp/p/nsys"), environ={})
    assert cmd.prefix == ["/opt/nsys/bin/nsys", "profile", "-t", "cuda,nvtx,osrt,cublas,cudnn",
                          "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "-o", "/tmp/p/nsys",
                          "-f", "true"]
    assert cmd.env == {} and cmd.notes == [] and not cmd.nvtx_capture


def test_nsys_args_are_appended_and_replace_the_options_they_set():
    extra = split_tool_args("--sample=none -t cuda,nvtx --cudabacktrace='kernel:1000'", "--nsys-args")
    assert extra == ["--sample=none", "-t", "cuda,nvtx", "--cudabacktrace=kernel:1000"]
    cmd = nsys_profile_command("nsys", Path("out/nsys"), extra, environ={})
    assert cmd.prefix == ["nsys", "profile", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
                          "-o", "out/nsys", "-f", "true", "--sample=none", "-t", "cuda,nvtx",
                          "--cudabacktrace=kernel:1000"]


def test_nvtx_capture_range_gets_the_register_only_variable():
    extra = ["--capture-range=nvtx", "--nvtx-capture=train_step"]
    cmd = nsys_profile_command("nsys", Path("n"), extra, environ={})
    assert cmd.prefix == ["nsys", "profile", "-t", "cuda,nvtx,osrt,cublas,cudnn", "--capture-range-end=stop",
                          "-o", "n", "-f", "true", *extra]
    assert cmd.nvtx_capture and cmd.env == {"NSYS_NVTX_PROFILER_REGISTER_ONLY": "0"}
    assert "NSYS_NVTX_PROFILER_REGISTER_ONLY=0" in cmd.notes[0]
    # the short form, and a value the user set already is theirs
    cmd = nsys_profile_command("nsys", Path("n"), ["-c", "nvtx"], environ={"NSYS_NVTX_PROFILER_REGISTER_ONLY": "1"})
    assert cmd.nvtx_capture and cmd.env == {} and "--capture-range=cudaProfilerApi" not in cmd.prefix


@pytest.mark.parametrize("args", [["-o", "x"], ["--output=x"], ["-f", "false"], ["--force-overwrite=false"]])
def test_nsys_args_may_not_move_the_report(args):
    with pytest.raises(NsightError, match="may not set"):
        nsys_profile_command("nsys", Path("n"), args, environ={})


def test_unsplittable_tool_args_are_one_error():
    with pytest.raises(NsightError, match="--nsys-args"):
        split_tool_args("--sample='none", "--nsys-args")


def test_nsys_export_command():
    assert nsys_export_command("nsys", Path("r/nsys.nsys-rep"), Path("r/nsys.sqlite")) == [
        "nsys", "export", "--type=sqlite", "--force-overwrite=true", "--output=r/nsys.sqlite", "r/nsys.nsys-rep"]


def test_ncu_profile_command_is_the_documented_one():
    assert ",".join(NCU_METRICS) == METRICS
    cmd = ncu_profile_command("/usr/local/cuda/bin/ncu", kernel_bases=["Kernel2", "flash_fwd_kernel"], count=26,
                              log_file=Path("/tmp/p/ncu.csv"))
    assert cmd == ["/usr/local/cuda/bin/ncu", "--target-processes", "all", "--nvtx", "--nvtx-include",
                   "opscope_step/", "-k", "regex:^(?:.*::)?(?:Kernel2|flash_fwd_kernel)$", "-c", "26",
                   "--metrics", METRICS, "--csv", "--page", "raw", "--print-units", "base",
                   "--log-file", "/tmp/p/ncu.csv"]
    with pytest.raises(NsightError, match="no kernels"):
        ncu_profile_command("ncu", kernel_bases=["k"], count=0, log_file=Path("x"))


def test_ncu_import_command():
    assert ncu_import_command("ncu", Path("a b.ncu-rep")) == [
        "ncu", "--import", "a b.ncu-rep", "--csv", "--page", "raw", "--print-units", "base"]


def test_kernel_regex_matches_function_names_with_or_without_namespace():
    regex = kernel_regex(["vectorized_elementwise_kernel", "sgemm_128x64_nn", "a.b"])
    pattern = re.compile(regex)
    for name in ("vectorized_elementwise_kernel", "at::native::vectorized_elementwise_kernel", "sgemm_128x64_nn",
                 "a.b"):
        assert pattern.fullmatch(name), name
    for name in ("vectorized_elementwise_kernel2", "my_vectorized_elementwise_kernel", "axb"):
        assert not pattern.fullmatch(name), name
    with pytest.raises(NsightError):
        kernel_regex([])


@pytest.mark.parametrize("name, base", [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"
     "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)", "vectorized_elementwise_kernel"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<at::native::AddFunctor<float> >"
     "(at::TensorIteratorBase&, at::native::AddFunctor<float> const&)::{lambda(int)#1}>(int, "
     "at::native::gpu_kernel_impl<at::native::AddFunctor<float> >(at::TensorIteratorBase&, "
     "at::native::AddFunctor<float> const&)::{lambda(int)#1})", "elementwise_kernel"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 8, false, false>(float*, float const*, "
     "int, int, int, bool const*, int, bool)", "softmax_warp_forward"),
    ("ampere_sgemm_128x64_tn", "ampere_sgemm_128x64_tn"),
    ("triton_poi_fused_add_0", "triton_poi_fused_add_0"),
    ("vectorized_elementwise_kernel", "vectorized_elementwise_kernel"),
    ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD"),
    ("Memset (Device)", "Memset"),
])
def test_kernel_base_name(name, base):
    assert kernel_base_name(name) == base


def test_kernel_key_agrees_across_the_profilers_spellings():
    torch_name = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl("
                  "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
                  "operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, ...)")
    ncu_name = ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::GeluCUDAKernelImpl("
                "at::TensorIteratorBase &, at::native::GeluType)::[lambda() (instance 2)]::operator ()() const::"
                "[lambda() (instance 4)]::operator ()() const::[lambda(c10::BFloat16) (instance 1)], "
                "std::array<char *, (unsigned long)2>>(int, T2, T3)")
    assert kernel_key(torch_name) == kernel_key(ncu_name)
    assert kernel_key("void f<float>(float*)") != kernel_key("void f<double>(double*)")
    assert kernel_key("void cutlass::Kernel2<A>(A::Params)") == "cutlass::Kernel2<A>"


def test_missing_gpu_and_tools_are_one_line_saying_where_they_come_from(monkeypatch):
    monkeypatch.setattr(commands.shutil, "which", lambda name: None)
    monkeypatch.setattr(commands, "installed_elsewhere", lambda tool: None)
    monkeypatch.setattr(commands, "nvidia_gpu_missing", lambda: "this machine has no NVIDIA GPU (...)")
    with pytest.raises(NsightError) as err:
        require_tools(nsys=True, ncu=True)
    message = str(err.value)
    assert "\n" not in message and message.startswith("--nsys and --ncu need an NVIDIA GPU and `nsys` and `ncu`")
    assert "no NVIDIA GPU" in message and "`nsys` is not on PATH" in message and "`ncu` is not on PATH" in message
    assert "https://developer.nvidia.com/nsight-systems" in message and "nsight-compute" in message


def test_a_tool_off_path_is_named(monkeypatch):
    monkeypatch.setattr(commands.shutil, "which", lambda name: None)
    monkeypatch.setattr(commands, "installed_elsewhere", lambda tool: f"/usr/local/cuda-12.4/bin/{tool}")
    monkeypatch.setattr(commands, "nvidia_gpu_missing", lambda: None)
    with pytest.raises(NsightError, match=r"there is one at /usr/local/cuda-12.4/bin/ncu: add its folder to PATH"):
        require_tools(nsys=False, ncu=True)


def test_tools_and_gpu_present(monkeypatch):
    monkeypatch.setattr(commands.shutil, "which", lambda name: f"/bin/{name}")
    monkeypatch.setattr(commands, "nvidia_gpu_missing", lambda: None)
    assert require_tools(nsys=True, ncu=False) == {"nsys": "/bin/nsys"}


def test_hidden_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert "hides every GPU" in commands.nvidia_gpu_missing()


def test_diagnoses():
    perm = ("==PROF== Connected to process 5 (/usr/bin/python3)\n==ERROR== ERR_NVGPUCTRPERM - The user does not "
            "have permission to access NVIDIA GPU Performance Counters on the target device 0.\n")
    why = diagnose("ncu", perm)
    assert "ERR_NVGPUCTRPERM" in why and "NVreg_RestrictProfilingToAdminUsers=0" in why and "CAP_SYS_ADMIN" in why
    none = diagnose("ncu", "==PROF== Disconnected from process 5\n==WARNING== No kernels were profiled.\n",
                    "NVTX range opscope_step/, kernels regex:^(?:.*::)?(?:k)$, -c 3")
    assert none.startswith("ncu profiled no kernels: its filters matched nothing (NVTX range opscope_step/")
    assert diagnose("nsys", "Generating '/tmp/x.qdstrm'\n") is None


def _fake_torch(folder, available: bool) -> None:
    """A `torch` package whose only answer is torch.cuda.is_available(), for the child process."""
    (folder / "torch").mkdir()
    (folder / "torch" / "__init__.py").write_text(
        "from types import SimpleNamespace\n"
        f"cuda = SimpleNamespace(is_available=lambda: {available})\n"
        "version = SimpleNamespace(cuda='13.0')\n")


@pytest.mark.parametrize("available", [True, False])
def test_the_gpu_is_present_when_torch_says_so_whatever_the_device_nodes(tmp_path, monkeypatch, available):
    """The H200 machine ran CUDA without /dev/nvidia0: the answer is torch.cuda.is_available()'s, asked
    in a child process (this machine has neither a GPU nor the node, so a node check says missing)."""
    _fake_torch(tmp_path, available)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    missing = commands.nvidia_gpu_missing()
    if available:
        assert missing is None
    else:
        assert "torch.cuda.is_available() is False" in missing and "no NVIDIA GPU" in missing
