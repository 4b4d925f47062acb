"""Run a voxpipe step on a cluster: render gang-scheduled pods through a launcher, submit, watch.

KFP cannot place its own task pods on a gang scheduler, so the pipeline's train component calls
`voxpipe launch-train`, which creates the job next to itself (a Volcano Job or a Kubeflow Trainer
TrainJob, launch.backend) and waits for it. base.py is the interface, registry.py names the backends.
"""
