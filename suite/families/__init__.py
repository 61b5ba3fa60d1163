"""Model families: how each Hugging Face architecture maps onto the layered view (embed, blocks, head)."""
from suite.families.bert import BertFamily

# A new family (GPT-2 for causal LM, say) is one module with the same five functions; methods only
# ever see the LayeredModel, so none of them changes.
FAMILIES = {"bert": BertFamily()}
