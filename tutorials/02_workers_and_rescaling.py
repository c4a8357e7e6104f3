# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Workers and rescaling (not written yet)
#
# TODO: this tutorial is to be written now that `snapshot.MultiProcessingReadingService` and
# logical shards (issue 4) have landed. It will show, with asserts: the same stream for a fixed seed with 0, 2 and 4
# workers; a snapshot taken with 4 workers, mid-epoch, restored onto 2 workers with no
# sample lost or seen twice; and what the manifest records about the layout.
#
# `tests/test_tutorials.py` skips this notebook, with the reason, until it is written. The cell below makes sure it fails if it is run before then.

# %%
raise NotImplementedError("tutorial 02 (workers and rescaling) is not written yet")
