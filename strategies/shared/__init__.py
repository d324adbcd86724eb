"""What the methods share: the bases of personalised (`personalized`), clustered (`clustered`) and
partial-sharing (`partial`) strategies, the client-graph core (`graph`, `priors`), exchange phases
(`phases`), the parameter matrix (`params`), reports (`reporter`), the message protocol both halves
import (`messages`, `fusion`, `settings`), the run config (`run_config`) and the method registry
(`registry`, `method`). No module here names a method."""
