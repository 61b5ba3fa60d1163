"""One node of test_multinode's two-node sweep: `python -m suite run` of a two-cell experiment (a GPipe pipeline of
2 stages on the distributed executor, and L2L on 2 data-parallel ranks), the node options passed through:

    SUITE_RESULTS_DIR=DIR python tests/multinode_sweep.py --nnodes 2 --node-rank R --rdzv-endpoint 127.0.0.1:PORT
"""

import sys

from test_runner import make_experiment

from suite.commands import cli
from suite.core import experiment
from suite.core.experiment import Row

EXPERIMENT = make_experiment(
    [
        Row("gpipe", "gpipe", {"executor": "dist", "stages": 2, "width": 1}),
        Row("l2l", "l2l", {"ranks": 2}),
    ]
)
# Found by name as the experiments of experiments/ are.
experiment.get_experiment = lambda name: EXPERIMENT

if __name__ == "__main__":
    sys.exit(cli.main(["run", EXPERIMENT.name, "--profile", "tiny", "--rounds", "1", "--wandb", "off", *sys.argv[1:]]))
