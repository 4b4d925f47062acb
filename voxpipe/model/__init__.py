"""Our VoxCPM2: config, building blocks, assembled model and checkpoint I/O.

Submodules are imported explicitly (`from voxpipe.model.config import preset`) so importing the
package stays cheap for steps that never build a model.
"""
