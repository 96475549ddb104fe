"""How a round is measured: the one round type and its clock (``rounds``), the scheduler,
hashing and slot_mapping rounds (``allocator``), implementation and reference rounds
interleaved A B B A with paired ratios (``paired``), clocks, timed calls and the one
garbage-collection policy (``timing``), statistics and bytes-moved models (``metrics``), and
what the benchmarks ran on (``machine``)."""
