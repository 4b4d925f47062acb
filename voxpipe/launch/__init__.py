"""Run `voxpipe train` on a cluster: render a gang-scheduled Volcano Job, submit it, watch it.

KFP cannot place its own task pods on Volcano, so the pipeline's train component calls
`voxpipe launch-train`, which creates the Volcano Job next to itself and waits for it.
"""
