"""The gRPC edge: protobuf <-> domain codec and the agent and operator servicers."""
