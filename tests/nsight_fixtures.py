"""Nsight fixtures built in the tests, following NVIDIA's documented formats (no GPU or Nsight here):

- an Nsight Systems SQLite export with the tables and columns of the "SQLite Schema Reference" (schema
  3.28.1, Nsight Systems 2026.4): StringIds, CUPTI_ACTIVITY_KIND_KERNEL / _RUNTIME / _MEMCPY / _MEMSET,
  NVTX_EVENTS, ENUM_NSYS_EVENT_TYPE, TARGET_INFO_GPU; any table or column can be left out, as older or
  lazily created exports do;
- Nsight Compute CSV text in the raw layout (a units row under the header) and the details layout.
"""

from __future__ import annotations

import csv
import io
import sqlite3
from pathlib import Path

PID, MAIN, AUTOGRAD = 77, 77, 80
GPU = "NVIDIA H100 80GB HBM3"
GEMM = ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>"
        "(cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4::Params)")
ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >"
       "(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")
WARMUP = "void warmup_kernel<float>(float*)"
ORPHAN = "orphan_kernel"
STEP_NS = 1_000_000
STEPS = 2

SCHEMA = {
    "StringIds": [("id", "INTEGER NOT NULL PRIMARY KEY"), ("value", "TEXT NOT NULL")],
    "ENUM_NSYS_EVENT_TYPE": [("id", "INTEGER NOT NULL PRIMARY KEY"), ("name", "TEXT"), ("label", "TEXT")],
    "TARGET_INFO_GPU": [("vmId", "INTEGER NOT NULL"), ("id", "INTEGER NOT NULL"), ("name", "TEXT"),
                        ("busLocation", "TEXT"), ("totalMemory", "INTEGER"), ("smCount", "INTEGER"),
                        ("computeMajor", "INTEGER"), ("computeMinor", "INTEGER")],
    "CUPTI_ACTIVITY_KIND_KERNEL": [
        ("start", "INTEGER NOT NULL"), ("end", "INTEGER NOT NULL"), ("deviceId", "INTEGER NOT NULL"),
        ("contextId", "INTEGER NOT NULL"), ("greenContextId", "INTEGER"), ("streamId", "INTEGER NOT NULL"),
        ("correlationId", "INTEGER"), ("globalPid", "INTEGER"), ("demangledName", "INTEGER NOT NULL"),
        ("shortName", "INTEGER NOT NULL"), ("mangledName", "INTEGER"), ("launchType", "INTEGER"),
        ("cacheConfig", "INTEGER"), ("registersPerThread", "INTEGER NOT NULL"), ("gridX", "INTEGER NOT NULL"),
        ("gridY", "INTEGER NOT NULL"), ("gridZ", "INTEGER NOT NULL"), ("blockX", "INTEGER NOT NULL"),
        ("blockY", "INTEGER NOT NULL"), ("blockZ", "INTEGER NOT NULL"), ("staticSharedMemory", "INTEGER NOT NULL"),
        ("dynamicSharedMemory", "INTEGER NOT NULL"), ("localMemoryPerThread", "INTEGER NOT NULL"),
        ("localMemoryTotal", "INTEGER NOT NULL"), ("gridId", "INTEGER NOT NULL"),
        ("sharedMemoryExecuted", "INTEGER"), ("graphNodeId", "INTEGER")],
    "CUPTI_ACTIVITY_KIND_RUNTIME": [
        ("start", "INTEGER NOT NULL"), ("end", "INTEGER NOT NULL"), ("eventClass", "INTEGER NOT NULL"),
        ("globalTid", "INTEGER"), ("correlationId", "INTEGER"), ("nameId", "INTEGER NOT NULL"),
        ("returnValue", "INTEGER NOT NULL"), ("callchainId", "INTEGER")],
    "CUPTI_ACTIVITY_KIND_MEMCPY": [
        ("start", "INTEGER NOT NULL"), ("end", "INTEGER NOT NULL"), ("deviceId", "INTEGER NOT NULL"),
        ("contextId", "INTEGER NOT NULL"), ("greenContextId", "INTEGER"), ("streamId", "INTEGER NOT NULL"),
        ("correlationId", "INTEGER"), ("globalPid", "INTEGER"), ("bytes", "INTEGER NOT NULL"),
        ("copyKind", "INTEGER NOT NULL"), ("deprecatedSrcId", "INTEGER"), ("srcKind", "INTEGER"),
        ("dstKind", "INTEGER"), ("srcDeviceId", "INTEGER"), ("srcContextId", "INTEGER"), ("dstDeviceId", "INTEGER"),
        ("dstContextId", "INTEGER"), ("migrationCause", "INTEGER"), ("graphNodeId", "INTEGER"),
        ("virtualAddress", "INTEGER"), ("copyCount", "INTEGER")],
    "CUPTI_ACTIVITY_KIND_MEMSET": [
        ("start", "INTEGER NOT NULL"), ("end", "INTEGER NOT NULL"), ("deviceId", "INTEGER NOT NULL"),
        ("contextId", "INTEGER NOT NULL"), ("greenContextId", "INTEGER"), ("streamId", "INTEGER NOT NULL"),
        ("correlationId", "INTEGER"), ("globalPid", "INTEGER"), ("value", "INTEGER NOT NULL"),
        ("bytes", "INTEGER NOT NULL"), ("graphNodeId", "INTEGER"), ("memKind", "INTEGER")],
    "NVTX_EVENTS": [
        ("start", "INTEGER NOT NULL"), ("end", "INTEGER"), ("eventType", "INTEGER NOT NULL"), ("rangeId", "INTEGER"),
        ("category", "INTEGER"), ("color", "INTEGER"), ("text", "TEXT"), ("globalTid", "INTEGER"),
        ("endGlobalTid", "INTEGER"), ("textId", "INTEGER"), ("domainId", "INTEGER"), ("uint64Value", "INTEGER"),
        ("int64Value", "INTEGER"), ("doubleValue", "REAL"), ("uint32Value", "INTEGER"), ("int32Value", "INTEGER"),
        ("floatValue", "REAL"), ("jsonTextId", "INTEGER"), ("jsonText", "TEXT"), ("binaryData", "TEXT"),
        ("eventId", "INTEGER NOT NULL PRIMARY KEY")],
}


def gtid(tid: int, pid: int = PID) -> int:
    """nsys' serialized GlobalId of a thread: ... | pid << 24 | tid."""
    return (pid << 24) | tid


def _nvtx(rows: list[dict], strings: dict[str, int], text: str, start: int, end: int | None, tid: int,
          registered: bool = False, event_type: int = 59, domain: int | None = None) -> None:
    row = {"start": start, "end": end, "eventType": event_type, "globalTid": gtid(tid), "domainId": domain,
           "eventId": len(rows) + 1}
    if registered:  # the `nvtx` package registers its strings: textId, no text
        row["textId"] = strings.setdefault(text, len(strings) + 1)
    else:
        row["text"] = text
    rows.append(row)


def scenario() -> dict[str, list[dict]]:
    """Two steps of a tiny model, as nsys would record them with opscope's ranges and emit_nvtx's:
    per step, a GEMM (100 µs) under aten::addmm inside module fc, an add kernel (10 µs) under aten::add,
    a 4-byte DtoH memcpy under aten::_local_scalar_dense, and a 64 KiB memset launched from autograd's
    thread under aten::zero_; plus a warmup kernel before the first step and, in step 0, a kernel whose
    launch is not in the runtime table."""
    strings: dict[str, int] = {}

    def sid(text: str) -> int:
        return strings.setdefault(text, len(strings) + 1)

    kernels, runtime, memcpy, memset, nvtx = [], [], [], [], []
    dev = {"deviceId": 0, "contextId": 1, "streamId": 7, "globalPid": PID << 24}
    geometry = {"registersPerThread": 64, "gridX": 80, "gridY": 1, "gridZ": 1, "blockX": 128, "blockY": 1,
                "blockZ": 1, "staticSharedMemory": 0, "dynamicSharedMemory": 0, "localMemoryPerThread": 0,
                "localMemoryTotal": 0, "gridId": 0}

    def kernel(name: str, start: int, end: int, corr: int) -> None:
        short = name.split("(")[0].split("<")[0].split("::")[-1].split()[-1]
        kernels.append({"start": start, "end": end, "correlationId": corr, "demangledName": sid(name),
                        "shortName": sid(short), "mangledName": sid("_Z" + short), **dev, **geometry})

    def launch(name: str, start: int, end: int, corr: int, tid: int = MAIN) -> None:
        runtime.append({"start": start, "end": end, "eventClass": 0, "globalTid": gtid(tid), "correlationId": corr,
                        "nameId": sid(name), "returnValue": 0})

    launch("cudaLaunchKernel_v7000", 400, 450, 1)
    kernel(WARMUP, 500, 600, 1)
    for s in range(STEPS):
        t = STEP_NS * (s + 1)
        c = 100 + 10 * s
        _nvtx(nvtx, strings, "opscope_step", t, t + 900_000, MAIN, registered=True)
        _nvtx(nvtx, strings, "opscope_module:fc (Linear)", t + 10_000, t + 500_000, MAIN, registered=True)
        _nvtx(nvtx, strings, f"aten::linear, seq = {s}, op_id = 1, sizes = [[64, 128], [256, 128], [256]], "
              "input_op_ids = [(0,0)]", t + 20_000, t + 200_000, MAIN)
        _nvtx(nvtx, strings, f"aten::addmm, seq = {s}, op_id = 2, sizes = [[256], [64, 128], [128, 256], [], []]",
              t + 30_000, t + 190_000, MAIN)
        launch("cudaLaunchKernel_v7000", t + 40_000, t + 45_000, c + 1)
        kernel(GEMM, t + 50_000, t + 150_000, c + 1)
        _nvtx(nvtx, strings, "aten::add, seq = 9, op_id = 3, sizes = [[64, 256], [64, 256], []]",
              t + 210_000, t + 300_000, MAIN)
        launch("cudaLaunchKernel_v7000", t + 220_000, t + 225_000, c + 2)
        kernel(ADD, t + 230_000, t + 240_000, c + 2)
        _nvtx(nvtx, strings, "aten::_local_scalar_dense, op_id = 4, sizes = [[]]", t + 600_000, t + 700_000, MAIN)
        launch("cudaMemcpyAsync_v3020", t + 610_000, t + 690_000, c + 3)
        memcpy.append({"start": t + 650_000, "end": t + 652_000, "correlationId": c + 3, "bytes": 4, "copyKind": 2,
                       "srcKind": 3, "dstKind": 2, **dev})
        _nvtx(nvtx, strings, "aten::zero_, op_id = 5, sizes = [[64, 256]]", t + 700_000, t + 800_000, AUTOGRAD)
        launch("cudaMemsetAsync_v3020", t + 710_000, t + 715_000, c + 4, tid=AUTOGRAD)
        memset.append({"start": t + 720_000, "end": t + 721_000, "correlationId": c + 4, "value": 0, "bytes": 65536,
                       "memKind": 3, **dev})
    kernel(ORPHAN, STEP_NS + 800_000, STEP_NS + 805_000, 999)
    _nvtx(nvtx, strings, "user", 10, None, MAIN, event_type=75, domain=5)  # a domain being created
    _nvtx(nvtx, strings, "a user range", STEP_NS + 5_000, STEP_NS + 6_000, MAIN, domain=5)
    _nvtx(nvtx, strings, "a mark", STEP_NS + 7_000, None, MAIN, event_type=34)
    return {
        "StringIds": [{"id": i, "value": v} for v, i in strings.items()],
        "ENUM_NSYS_EVENT_TYPE": [{"id": 34, "name": "NvtxMark", "label": "NVTX Mark"},
                                 {"id": 59, "name": "NvtxPushPopRange", "label": "NVTX PushPop Range"},
                                 {"id": 60, "name": "NvtxStartEndRange", "label": "NVTX StartEnd Range"},
                                 {"id": 75, "name": "NvtxDomainCreate", "label": "NVTX Domain Create"}],
        "TARGET_INFO_GPU": [{"vmId": 0, "id": 0, "name": GPU, "busLocation": "0000:01:00.0", "smCount": 132,
                             "computeMajor": 9, "computeMinor": 0}],
        "CUPTI_ACTIVITY_KIND_KERNEL": kernels, "CUPTI_ACTIVITY_KIND_RUNTIME": runtime,
        "CUPTI_ACTIVITY_KIND_MEMCPY": memcpy, "CUPTI_ACTIVITY_KIND_MEMSET": memset, "NVTX_EVENTS": nvtx,
    }


def build_nsys_sqlite(path: Path, data: dict[str, list[dict]] | None = None, *, drop_tables: tuple[str, ...] = (),
                      drop_columns: dict[str, tuple[str, ...]] | None = None) -> Path:
    """Writes `data` (default: scenario()) as an nsys export, without the tables and columns named."""
    data = scenario() if data is None else data
    drop_columns = drop_columns or {}
    con = sqlite3.connect(path)
    for table, columns in SCHEMA.items():
        if table in drop_tables:
            continue
        cols = [(c, t) for c, t in columns if c not in drop_columns.get(table, ())]
        quoted = [f'"{c}"' for c, _ in cols]
        con.execute(f'CREATE TABLE "{table}" ({", ".join(f"{q} {t}" for q, (_, t) in zip(quoted, cols, strict=True))})')
        for row in data.get(table, []):
            con.execute(f'INSERT INTO "{table}" ({", ".join(quoted)}) VALUES ({", ".join("?" for _ in cols)})',
                        [row.get(c, _default(t)) for c, t in cols])
    con.commit()
    con.close()
    return path


def _default(sql_type: str) -> object:
    """What nsys writes for a NOT NULL column a row does not set (0); else NULL."""
    return 0 if "NOT NULL" in sql_type and "PRIMARY" not in sql_type else None


# --- Nsight Compute CSV ----------------------------------------------------------------------------------

IDENTITY = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC"]


def _csv_line(values: list[str]) -> str:
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="").writerow(values)
    return out.getvalue()


def ncu_raw_csv(kernels: list[dict[str, str]], units: dict[str, str], *, prof_lines: bool = True) -> str:
    """The raw page: ==PROF== lines, the header, the units row, one row per kernel (values given as ncu
    prints them: '1,234.5', 'n/a')."""
    metrics = list(units)
    lines = ["==PROF== Connected to process 4242 (/usr/bin/python3.11)"] if prof_lines else []
    if prof_lines:
        lines += [f'==PROF== Profiling "{k["name"].split("(")[0].split("<")[0].split()[-1]}" - {i}: 0%....50%....100% '
                  "- 9 passes" for i, k in enumerate(kernels)]
    lines.append(_csv_line(IDENTITY + metrics))
    lines.append(_csv_line([""] * len(IDENTITY) + [units[m] for m in metrics]))
    for i, k in enumerate(kernels):
        lines.append(_csv_line([str(i), "4242", "python3.11", "127.0.0.1", k["name"], "1", "7", "(128, 1, 1)",
                                "(80, 1, 1)", "0", "9.0"] + [k.get(m, "n/a") for m in metrics]))
    if prof_lines:
        lines.append("==PROF== Disconnected from process 4242")
    return "\n".join(lines) + "\n"


def ncu_details_csv(kernels: list[dict[str, str]], units: dict[str, str]) -> str:
    """The details page: one row per (kernel, metric), the unit in its own column."""
    header = IDENTITY + ["Section Name", "Metric Name", "Metric Unit", "Metric Value"]
    lines = ["==PROF== Connected to process 4242 (/usr/bin/python3.11)", _csv_line(header)]
    for i, k in enumerate(kernels):
        for m, unit in units.items():
            lines.append(_csv_line([str(i), "4242", "python3.11", "127.0.0.1", k["name"], "1", "7", "(128, 1, 1)",
                                    "(80, 1, 1)", "0", "9.0", "Command line profiler metrics", m, unit,
                                    k.get(m, "n/a")]))
    return "\n".join(lines) + "\n"


# The shared H100 BERT-small trace and the ncu measurements of the same model (tests/fixtures/nsight).
BERT = Path(__file__).parent / "fixtures" / "traces" / "h100_bert-small_bf16.json.gz"
FIXTURES = Path(__file__).parent / "fixtures" / "nsight"
RAW = FIXTURES / "h100_bert-small_ncu_raw.csv"
VOCAB = "transformers/models/bert/modeling_bert.py:786"
