"""Integrations with the tools people train with, one small module per tool.

- `snapshot.integrations.accelerate`: `reading_service_for(accelerator)`;
  `pip install "datapipe-snapshot[accelerate]"`.
- `snapshot.integrations.lightning`: `reading_service_for(trainer)`, `LightningLoader`;
  `pip install "datapipe-snapshot[lightning]"`.
- `snapshot.integrations.torchdata`: `SnapshotDataset` (for `StatefulDataLoader`, torchdata 0.9
  or >= 0.10) and `as_node` (a `torchdata.nodes` node);
  `pip install "datapipe-snapshot[torchdata-nodes]"`.

- `snapshot.integrations.dcp`: `load` (``torch.distributed.checkpoint.load`` reading each rank's
  parts only); a :class:`~snapshot.DataLoader2` is ``Stateful`` as it is, so ``dcp.save`` needs
  nothing (see the DCP how-to).

Importing :mod:`snapshot` imports none of these tools; importing one of these modules
without its tool raises an ``ImportError`` that names the extra to install. The modules use
only the public API of :mod:`snapshot`, but for ``dcp``, which asks the loader's state-dict module
(``snapshot.loader._state_dict``) which keys of a saved state a rank reads.
"""
