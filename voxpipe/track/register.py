"""`voxpipe register`: the pipeline run into MLflow, then its export into the model registry.

Reads the run's artifacts (export, train report + metrics, eval.json + samples, mfu.json, ingest
folder), finds or creates the pipeline's MLflow run (tracking.py; with `train.track` the run the
trainer logged into live), logs what is not logged yet (record.py), registers the export
(registry.py), writes its model card and dataset card (cards.py) and `registered.json`. Before it
writes anything, it checks that nobody but the pipeline's account (and MLflow admins) can edit the
experiment or the registered model (ownership.py). In a sweep (`tracking.parent_run` set) the run is
logged as the parent's child and its export as a model in it, but no model version is made:
`sweep-close` registers the sweep's best (sweep.py). Rank-free: it runs once, after training (the
trainer's live logging is over by then), so one process writes the run at a time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voxpipe.lineage import kfp_run_id, md5_file
from voxpipe.params import Params
from voxpipe.report import write_json, write_report
from voxpipe.secrets import allowing
from voxpipe.track.artifacts import load_artifacts
from voxpipe.track.cards import WATERMARK_TAG, publish_cards
from voxpipe.track.consent_revoke import CONSENT_IDS_TAG, trained_consent_ids
from voxpipe.track.kfp_runs import kfp_task, link_task_runs
from voxpipe.track.note import NOTE_TAG, run_note
from voxpipe.track.ownership import check_owned
from voxpipe.track.record import log_pipeline_run, run_params, run_title
from voxpipe.track.registry import Place, ensure_registered_model, register_export
from voxpipe.track.sweep import child_record
from voxpipe.track.tracking import (
    not_secret_values,
    orchestrator_run,
    pipeline_experiments,
    pipeline_key,
    pipeline_run,
    redact_params,
    redact_uri,
    resolve_tracking_uri,
    run_secrets,
    scrub,
    session,
)
from voxpipe.track.voices import ASSUMED_LOCALE, LOCALE_TAG, training_locale

RUN_NAME_TAG = "mlflow.runName"  # what the MLflow UI lists a run by

@dataclass
class RegisterResult:
    out: Path
    registered: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        r = self.registered
        if "sweep" in r:
            return (f"register: run {r['run_id']} logged as a child of sweep {r['sweep']['parent_run']} "
                    f"(logged: {', '.join(r['logged']) or 'nothing new'}); no model version: `voxpipe "
                    f"sweep-close` registers the sweep's best -> {self.out / 'registered.json'}")
        d = r["decision"]
        aliases = " ".join(f"@{a}" for a in r["aliases"]) or "no alias"
        state = "registered" if r["created"] else "already registered (nothing new)"
        locale = (f"text read in {r['locale']}" if r.get("locale") else "no locale recorded in the training "
                  f"data (ingested before ingest recorded it): {ASSUMED_LOCALE} assumed when it speaks")
        return (
            f"register: {r['name']} v{r['version']} {state}, {aliases}; {d['reason']}; {locale}; "
            f"run {r['run_id']} (logged: {', '.join(r['logged']) or 'nothing new'}) "
            f"-> {self.out / 'registered.json'}"
        )


def register(params: Params) -> RegisterResult:
    with allowing(not_secret_values(params)):  # launch.env values that only look like secrets
        return _register(params)


def _register(params: Params) -> RegisterResult:
    p, tracking = params.register_, params.tracking
    name = params.registered_model_name()
    start = time.perf_counter()
    work, out = Path(tracking.work), Path(p.out)
    art = load_artifacts(p)
    uri = resolve_tracking_uri(tracking.uri, work)
    flat = run_params(params, art)
    secrets = run_secrets(params, flat)
    logged_params = redact_params(flat, secrets)
    run_name = scrub(p.run_name, secrets) if p.run_name else run_title(name, flat)
    key = pipeline_key({"params": logged_params, "export": art.export_md5, "train": art.train_digest,
                        "eval": art.eval_digest, "mfu": md5_file(art.mfu_path), "kfp_run_id": kfp_run_id()})
    extra = {"voxpipe.pipeline_key": key}
    if art.data is not None:
        extra["voxpipe.data_version"] = art.data.version
        extra[CONSENT_IDS_TAG] = ",".join(trained_consent_ids(art.data.report, art.data.rows))
    synthesis = params.synthesize  # what synthesize and serve mark every clip with (the model card says it)
    extra[WATERMARK_TAG] = synthesis.watermark if synthesis.watermark != "off" else (
        f"off: {synthesis.watermark_off_reason}")
    locale = training_locale(art.data.rows) if art.data is not None else None
    if locale is not None:
        extra[LOCALE_TAG] = locale
    with session(uri) as client:
        experiment, locks = pipeline_experiments(client, tracking.experiment, uri, work)
        ensure_registered_model(client, name)
        check_owned(uri, experiment, tracking.experiment, name, locks)  # before anything is written there
        ref = pipeline_run(client, experiment, work, key, uri, run_name, art.live_run_id)
        if (task := kfp_task(client)) is not None:  # KFP's plugin: each step its own nested run
            link_task_runs(client, task, art.live_run_id)
        if orchestrator_run(client) is None:  # the trainer's live run, or ours: named for what it is
            client.set_tag(ref.run_id, RUN_NAME_TAG, run_name)
        logged = log_pipeline_run(client, ref.run_id, art, logged_params, key, out, secrets)
        if tracking.parent_run:
            child = child_record(client, ref.run_id, tracking.parent_run, art, logged_params)
        else:
            reg = register_export(client, Place(uri, locks, p.lock_timeout_s), name, ref.run_id, art, extra)
        version = None if tracking.parent_run else reg
        cards = publish_cards(client, params, art, out, ref.run_id, version, name, extra)
        client.set_tag(ref.run_id, NOTE_TAG, scrub(run_note(art), secrets))  # the run page's description
        if locale is not None:  # the run's too: sweep-close tags the version of its best child with it
            client.set_tag(ref.run_id, LOCALE_TAG, locale)
        client.set_terminated(ref.run_id, "FINISHED")
    common = {"run_id": ref.run_id, "experiment_id": ref.experiment_id, "tracking_uri": redact_uri(uri),
              "logged": logged, "cards": {k: str(v) for k, v in cards.items()}}
    if tracking.parent_run:  # a sweep's child: sweep-close registers the best
        registered = {"name": name, "sweep": child, **common}
    else:
        registered = {"name": reg.name, "version": reg.version, "aliases": reg.aliases,
                      "created": reg.created, "decision": reg.decision.as_dict(),
                      "model_uri": f"models:/{reg.name}/{reg.version}",
                      "logged_model_uri": reg.model_source, "locale": locale, **common}
    write_json(out / "registered.json", registered)
    write_report(out, registered, run={"seconds": round(time.perf_counter() - start, 3)})
    return RegisterResult(out, registered)
