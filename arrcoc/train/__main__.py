"""python -m arrcoc.train: the same as `arrcoc train`, without loading the other subcommands."""

import argparse
import sys

from ..cli.train import add_arguments

parser = argparse.ArgumentParser(prog="python -m arrcoc.train")
add_arguments(parser)
args = parser.parse_args()
sys.exit(args.func(args))
