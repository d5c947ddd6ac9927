"""Reference oracles: exact sampling distributions and the statistics that compare an engine against them."""
