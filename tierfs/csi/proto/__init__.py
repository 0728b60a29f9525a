"""The CSI specification's protocol (v1.12.0, vendored: see NOTICE) and its generated stubs.

The stubs are committed rather than generated at install time: installing
tierfs then needs only grpcio and protobuf (not grpcio-tools and a protoc run),
the container image builds with a plain ``pip install``, and what runs is what
was reviewed. ``make csi-proto`` regenerates them; tests/test_csi_proto.py fails
when they differ from what the pinned grpcio-tools makes of csi.proto.
"""
