"""Model families: how each Hugging Face architecture maps onto the layered view (embed, blocks, head)."""

from suite.harness.families.bert import BertFamily
from suite.harness.families.bert_mlm import BertMLMFamily
from suite.harness.families.gpt2 import GPT2Family
from suite.harness.families.llama import LlamaFamily

# A family is one module with the same six members (build, split, mask, embed, block, gradient_free)
# and an `objective` (classify, mlm, clm) that tells suite.harness.data which labels to make; methods only
# ever see the LayeredModel, so none of them changes.
FAMILIES = {"bert": BertFamily(), "bert-mlm": BertMLMFamily(), "gpt2": GPT2Family(), "llama": LlamaFamily()}
