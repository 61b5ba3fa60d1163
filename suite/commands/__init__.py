"""The command-line face: the parser and its commands (cli), the campaign, the estimate and the sweep that renders
its tables; above the experiments and the engine, which never import it."""
