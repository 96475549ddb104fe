"""What the benchmarks replay: a workload's name resolved (``source``: a built-in scenario, a
request trace file or a recorded corpus), the seeded scenarios (``scenarios``), request trace
files read, bounded and written (``trace_file``, ``request_trace``), and a grouped spec's
workloads (``hybrid``)."""
