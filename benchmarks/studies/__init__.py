"""The one-off studies: each script here answered one question, and its results are history
(their `command` fields name the module path they were run from, `python -m benchmarks.<study>`
before the studies moved here). The experiments that are re-run are configs of the runners
(`benchmarks.compare`, `benchmarks.suite`); a study is re-run only to answer its question again.

- `aggregation_floor`: What is the least any per-client aggregation can cost against FedAvg's plain mean (the memory-traffic floor)?
- `client_profile`: Where does one deployed message's time go inside a fresh ClientApp process, stage by stage?
- `deploy_speed`: How do deployed rounds compare: Bouquet's fedavg against a minimal Flower app on the same deployment, and each method against deployed fedavg?
- `fedcg_ceiling`: How well can FedCG's domain classifier tell the domains apart when it is told them (each pooling's supervised ceiling)?
- `fedcg_cost`: What does one FedCG local epoch cost a client against one FedAvg local epoch?
- `fedcg_discovery`: How well does FedCG's teacher/student loop discover the domains on its own, and which settings change that?
- `fedcg_domains`: Does FedCG beat FedAvg on multi-domain data with held-out test clients, and which of its parts (controls, ablations) make the difference?
- `first_run`: How long are a new user's first minutes: the README quick start's install and its first runs?
- `flower_speed`: Is a round of Bouquet's fedavg slower than a minimal Flower FedAvg app doing the same work in one process?
- `flt_scale`: Does FLT scale to 2,400 clients: FCR's server side within a minute, its aggregation within 2x FedAvg's mean?
- `flt_structure`: Does the thresholded graph's contrast tell data with client groups from data without, across partitions, client counts and seeds?
- `flt_thresholds`: Which threshold rule gives FLT a client graph whose edges stay inside the true groups?
- `flwr_run_speed`: How does Bouquet's fedavg under `flwr run` compare with Flower's minimal app in the same simulation, and with the same job in process?
- `privacy_accountant`: How much of a DP-SGD round is the accountant's ε, and how much does caching it save?
- `ray_workers`: Do Ray workers shorten the suite's and compare's wall time while giving the same numbers, bit for bit?
- `server_memory`: How much server memory does SFL need as the clients grow, in memory and memory-mapped?
- `sfl_reading`: How many lines must one read to follow SFL end to end, and how large a share of them is SFL's own?
- `sfl_scale`: How long does SFL's server aggregation take at scale, as a multiple of the plain mean of the same matrix?
- `untuned`: Does FLT keep up with max(FedAvg, FedAvg+FT, Local) on settings no rule was tuned on, drawn before its structure decision changed?
- `slice_cost`: What does the safeguard's held-out slice cost a client that trains alone, and is it the samples or the batches?
- `safeguard_answers`: What does a graph method's client answer with at the last evaluation, against its own model and the model it received?
"""
