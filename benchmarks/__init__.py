"""tierfs benchmarks: tierfs against its peers and the physical limits, in one run.

"Faster than X" means nothing unless X ran against the same backend, on the
same machine, in the same run. ``make bench`` (full sizes) and
``make bench-quick`` (small sizes, under 3 minutes) start the embedded GCS
emulator and run the same workloads on every system, twice: on the plain
emulator (RAM, ~1.5 ms per request, GB/s) and through a GCS-shaped link
(`shaping`: +20 ms per request, 200 MB/s per connection), because caches and
parallelism only show their worth on the second.

Layout (each module's docstring says why it is the way it is):

- `systems`   the systems: rclone mount, a null pyfuse3 file system, the GCS
              client used directly (the backend limit), local disk and tmpfs
              (the local limits);
- `tierfs_systems` tierfs (default options) and its variants: the GKE
              checkpointing option line, the write modes, kept listings;
- `workloads` what a workload is made of: `Workload`, `Metric`, `Cell`;
- `writes`, `reads`, `multiread`, `metadata`, `saves`  the workloads, one small class each;
- `catalog`   the registry of systems and workloads, in the order ``make bench``
              runs them;
- `direct`    the fastest direct GCS client this harness knows;
- `shaping`   the GCS-shaped link (a TCP proxy);
- `env`       the emulator, proxy, data sets and clean-up of one run;
- `data`      the random bytes written, and how reads are verified;
- `cpu`       CPU seconds per GiB of a cold read: reader, daemon, emulator;
- `runner`    one cell per (profile, workload, system), never crashing the run;
- `report`    terminal table, JSON, Markdown and PNG under ``results/``;
- `profile`   ``python -m benchmarks.profile WORKLOAD SYSTEM``: py-spy on the daemon.

To grow it: a new system is one `systems.System` subclass added to
``catalog.SYSTEMS``; a new workload is one `workloads.Workload` subclass (its metrics,
a ``run(cell)``) added to ``catalog.WORKLOADS``; sizes for both modes are fields of
`env.Sizes`. The report picks them up by themselves.
"""
