"""The papers' claims the README's table judges, each with the section of records and the rule it is read by."""

from experiments.claims import counting, l2l, pipedream_2bw

# The counts' own check first: every counted verdict below rests on it
CLAIMS = [*counting.CLAIMS, *l2l.CLAIMS, *pipedream_2bw.CLAIMS]
