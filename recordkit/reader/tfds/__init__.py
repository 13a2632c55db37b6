"""tensorflow-datasets folders: their splits, shards and feature types, without TFDS.

A dataset that ``tfds`` prepared lives in a version folder
(``~/tensorflow_datasets/mnist/3.0.1/``) holding ``dataset_info.json`` (name, splits
with their shard lengths, file-name template), ``features.json`` (the
``FeaturesDict``) and the shards, ``mnist-train.tfrecord-00000-of-00001``, whose
``tf.train.Example``\\ s hold each feature as TFDS serialized it.
:func:`tfds_folder` recognises such a folder (or a shard inside one); :class:`TFDSInfo`
lists its splits and describes each feature; :class:`TFDSView` turns decoded records
into what ``tfds`` itself returns (the table in ``docs/howto/foreign-tfrecords.md``;
``ClassLabel`` names in :attr:`TFDSInfo.class_names`). Nested features are flattened
with ``/`` (``objects/bbox``), as in the records.

Nothing is written into the folder. Features this module does not know
(``Video``, ``Audio``, nested ``Sequence``, optional tensors, ...) are refused by
name when the folder is opened, never read in part.
"""

from __future__ import annotations

from ._decoder import TFDSBatchDecoder
from ._feature import TFDSFeature
from ._info import INFO_NAME, TFDSInfo, TFDSView, tfds_folder, tfds_hint

__all__ = [
    "INFO_NAME",
    "TFDSBatchDecoder",
    "TFDSFeature",
    "TFDSInfo",
    "TFDSView",
    "tfds_folder",
    "tfds_hint",
]
