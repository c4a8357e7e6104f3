"""``snapshot verify --graph`` on a snapshot saved by a training script (its graph's functions defined in
the script, which ran as ``__main__``, as in docs/how-to/distributed.md): ``--graph train.py:build_graph``
runs the script as ``__main__`` without its ``if __name__ == "__main__":`` block and passes; naming it as a
module says why that cannot match, and what to pass instead."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.cli.test_cli import run_cli_batch
from tests.integration_jobs import job_env

TRAIN = textwrap.dedent('''
    import sys
    from torch.utils.data import IterDataPipe
    from torch.utils.data.datapipes.iter import IterableWrapper

    import snapshot

    SIZE = 48


    class Tagged(IterDataPipe):
        def __init__(self, datapipe):
            self.datapipe = datapipe

        def __iter__(self):
            for x in self.datapipe:
                yield {"id": x}


    def decode(x):
        return 2 * x


    def build_graph(size=SIZE):
        return Tagged(IterableWrapper(range(size)).shuffle(buffer_size=8).map(decode).map(lambda x: x + 1)).batch(4)


    def main(path):
        loader = snapshot.DataLoader2(build_graph())
        loader.seed(0)
        it = iter(loader)
        next(it)
        loader.save_snapshot(path)
        loader.shutdown()
        open(path + ".trained", "w").close()


    if __name__ == "__main__" and len(sys.argv) > 1:
        main(sys.argv[1])
    elif __name__ == "__main__":
        SIZE = 48   # the script's own `else` branch runs, as it would
''')


def test_a_scripts_graph_is_verified_by_running_the_script_as_main(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "other.py").write_text(TRAIN.replace("2 * x", "3 * x"))
    saved = str(tmp_path / "data.snap")
    subprocess.run([sys.executable, "train.py", saved], cwd=tmp_path, env=job_env(), check=True, timeout=120)
    Path(saved + ".trained").unlink()
    script, module, changed, as_json = run_cli_batch(
        ["verify", saved, "--graph", "train.py:build_graph"], ["verify", saved, "--graph", "train:build_graph"],
        ["verify", saved, "--graph", "other.py:build_graph"],
        ["verify", saved, "--graph", str(tmp_path / "train.py") + ":build_graph", "--json"], cwd=str(tmp_path))
    assert script.returncode == 0, script.stdout + script.stderr
    assert "ok    graph      train.py:build_graph builds the saved graph (6 nodes" in script.stdout
    assert not Path(saved + ".trained").exists()          # the script's __main__ block did not run
    assert json.loads(as_json.stdout)["ok"] is True        # a path from anywhere
    # imported as a module, the script's functions are train.decode, not __main__.decode: why, and what to pass
    assert module.returncode == 1
    words = " ".join(module.stdout.split())
    assert "The snapshot's graph was built by a script run as __main__" in words
    assert "Pass the script's path instead, --graph train.py:build_graph" in words
    # the script's path still finds a change to its code
    assert changed.returncode == 1 and "code" in changed.stdout and "changed" in changed.stdout, changed.stdout
