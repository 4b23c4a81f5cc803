"""`mtpstack bench`: measure serving configurations carefully (prove the weights, sweep draft depth, decide on the spread)."""
