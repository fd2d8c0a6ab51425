"""Compiled engines built from a bundle's step graphs on the machine that runs them (experimental).

trt_ops.py          the ONNX operators TensorRT's parser supports (version and source recorded) and a checker
tensorrt_record.py  the manifest's engines["tensorrt"] record: profiles, compatibility with this machine
tensorrt_build.py   `specedge build BUNDLE --tensorrt`: strongly typed engines written into the bundle
The runtime side is specedge/runtime/backends/tensorrt.py. Nothing here imports tensorrt until it builds.
"""
