"""The papers' claims the README's table judges, each with the section of records and the rule it is read by."""

from experiments.claims import l2l, pipedream_2bw

CLAIMS = [*l2l.CLAIMS, *pipedream_2bw.CLAIMS]
