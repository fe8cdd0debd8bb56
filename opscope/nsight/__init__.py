"""NVIDIA Nsight Systems (`nsys`) and Nsight Compute (`ncu`) next to the modeled numbers. Torch-free.

- commands: finding the tools, the exact command lines opscope runs, the NVTX range names, and one-line
  diagnoses of the tools' known failures;
- nsys_sqlite: reads `nsys export --type sqlite` (kernels, launches, memcpy/memset, NVTX push/pop
  ranges), attributes device work to steps, modules and ops, and turns a report into a TraceData;
- ncu_csv: reads `ncu --csv` output (raw and details pages, units, thousands separators, n/a);
- measured: the kernel plan of a profiled run, the alignment of measured kernels to its op rows, and
  the `measured_*` / `nsys_*` columns;
- session: `opscope profile --nsys/--ncu` (the extra passes under the tools); imports: `opscope analyze`
  of Nsight files.
"""
