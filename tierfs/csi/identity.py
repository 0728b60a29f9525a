"""The CSI Identity service, and a Controller service that offers nothing.

tierfs has no controller side (no dynamic provisioning, no attach: a bucket
exists before its PV). ControllerGetCapabilities still answers, with an empty
list, because conformance clients (csi-sanity v5.4.0's Node suite) call it on
node-only plugins; every other Controller RPC is UNIMPLEMENTED (the generated
servicer's default).
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import wrappers_pb2

from tierfs import __version__
from tierfs.csi.proto import csi_pb2, csi_pb2_grpc

DRIVER_NAME = "tierfs.csi.tierfs.dev"


class Identity(csi_pb2_grpc.IdentityServicer):
    def __init__(self, name: str = DRIVER_NAME) -> None:
        self.name = name

    def GetPluginInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return csi_pb2.GetPluginInfoResponse(name=self.name, vendor_version=__version__)

    def GetPluginCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        return csi_pb2.GetPluginCapabilitiesResponse(capabilities=[])  # node only

    def Probe(self, request: Any, context: grpc.ServicerContext) -> Any:
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=True))


class Controller(csi_pb2_grpc.ControllerServicer):
    def ControllerGetCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        return csi_pb2.ControllerGetCapabilitiesResponse(capabilities=[])
