"""The papers' supervised tables on GLUE: every fine-tuning method x task x seed on the full training sets,
evaluated on dev, in the papers' table shapes.

    python -m experiments.campaign [--config experiments/reproductions/configs/glue_methods.json] [--data-dir ../shared/data]
        [--cpu-campaign | --only task=rte,mrpc method=baseline,cosine protocol=appB seed=0,1]
        [--sweep] [--runs-dir runs/glue_methods] [--out experiments/results]
        [--cost experiments/results/glue_cost.json] [--time-limit MINUTES [--stop-at-limit]] [--report-only] [--dry-run]

The configuration (committed) names the model, tasks, seeds and *protocols*: each protocol is one paper's
hyperparameters (``defaults``, and ``overrides`` for the runs whose task or method match, both as dotted settings of
:class:`~isojax.train.config.TrainConfig` such as ``"optim.learning_rate"``) with its own baseline and its methods
(a method = the settings that make it: ``"method.name"``, ``"method.regularizers"``, ...). A run is one (protocol,
method, task, seed): its :class:`~isojax.train.config.TrainConfig` (:meth:`~experiments.campaign.spec.Run.config`) is written to
``<runs-dir>/<protocol>/<task>/<method>/seed<seed>/config.json`` and run there by ``isojax finetune --config``; the
run is done when its ``results.json`` exists there or in the committed run records (below). Running the command again skips
done runs and resumes an interrupted one from its last checkpoint, so a campaign can be finished in several
sittings, also from a fresh checkout. The cheapest run goes first, by the measured cost table
(:mod:`experiments.benchmarks.glue_cost`, read again before each run), then the configuration's method priority, then the
seed (:func:`~experiments.campaign.schedule.campaign_order`). ``--cpu-campaign`` runs the configuration's ``cpu_campaign``: the union of its
``selections`` and, with ``sweep``, the sweeps, in one order, less any run that the cost table estimates longer
than its ``max_run_minutes`` (one sitting: a run's checkpoints live on the machine that ran it; such a run is left to
an accelerator, and the report says so). ``--time-limit MINUTES`` keeps that order but starts a run only where its
estimate fits in what is left of the minutes since the campaign started, and stops where none does (a sitting, or a
batch job's wall-time limit, then ends between runs instead of in the middle of one); where this sitting's runs took
longer than their estimates (a loaded machine), the estimates are scaled by that ratio. With ``--stop-at-limit`` it
instead runs the runs in that order whatever their estimates, and at the limit sends the run in progress ``SIGTERM``:
it checkpoints the step it is at and exits (:mod:`isojax.train.preemption`), its sitting is recorded in its
``sittings.json``, and the next sitting resumes it, so a run longer than any one sitting still gets done (on the
machine that holds its checkpoints); its ``campaign.json`` then counts the wall time of all its sittings. Each run is
a separate ``python -m isojax.cli finetune --config`` process (a killed campaign loses at most the steps since that run's last checkpoint); JAX's persistent
compilation cache is shared by the runs. A run that non-finite numbers stop (``isojax finetune`` exits with status 3
after ``max_nonfinite_steps`` skipped steps in a row) is a result, not a crash: its ``campaign.json`` records the
error (``"diverged"``), the campaign goes on and does not run it again (delete that file to retry it), and the
report lists it; any other failure stops the campaign.

The report (``<out>/glue_methods.md``, ``.json``, ``glue_methods_curves.png``) has, per task and protocol, one line
per method: the task metrics as mean ± std over seeds with the two-sample t-test against the protocol's baseline
(``scipy.stats.ttest_ind``, equal variances, as isotropy-calibration-evaluation Table 1; ``*`` marks p < 0.05) and
the paired t-test over the seeds whose runs are paired (:mod:`experiments.reproductions.glue_pairing`; each run's
``campaign.json`` records its pairing), "not run" and the reason for a method without a finished run, the isotropy
of the evaluated representation (IsoScore, EV1-3 and the raw anisotropy of the [CLS] / head input, I1 and I2 of the
word embedding matrix), each regulariser term at the first and the last logged training step (unweighted, mean
over seeds: did the optimiser move it?) and the training seconds per epoch (isotropy-calibration-evaluation reports
time per epoch). The Isotropy Layer has two lines (stage 1, the fine-tuned model, and stage 2). A summary follows,
paper by paper (the configuration's ``summaries``): the claim, and per task the difference to the baseline, Cohen's
d, both p-values, the dev IsoScore beside the baseline's (with the paired t-test over the same pairs of seeds) and
the regulariser terms' first and last logged values.
Every finished run's ``results.json``, ``log.jsonl`` and ``campaign.json`` (wall time, commit, machine) are copied
to ``<out>/glue_methods_runs/``, so every number of the report can be traced to a run's own record.

``--sweep`` runs the sweeps of the configuration instead (``sweeps``: per method, one or more settings and the values
each is swept over, one setting at a time: the regulariser weights the papers leave open, ``"method.regularizers"``,
and the flow's ``"optim.transform_learning_rate"``; see :func:`~experiments.campaign.spec.expand`); the sweeps are reported in
``<out>/glue_methods_sweep.md`` (records in ``glue_methods_sweep_runs/``).

The package, by concern (``docs/design/campaign.md``): :mod:`~experiments.campaign.spec` (what runs),
:mod:`~experiments.campaign.schedule` (in which order, within which time), :mod:`~experiments.campaign.runner` (the
processes and their records), :mod:`~experiments.campaign.statistics` (the tests), :mod:`~experiments.campaign.report`
and :mod:`~experiments.campaign.curves` (the Markdown, JSON and figure), :mod:`~experiments.campaign.cli` (the command
line). The cost table is measured by :mod:`experiments.benchmarks.glue_cost`, which uses the campaign's own runs; the
campaign imports nothing of it.
"""
