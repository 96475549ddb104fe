"""How a workload is driven: the continuous-batching loop through the adapter protocol
(``scheduler``), the same loop on an engine's own objects (``native``), a recorded corpus
replayed call by call with the conformance Driver's step planning (``recorded``), and the
harness's own floor and an adapter's protocol layer (``harness``)."""
