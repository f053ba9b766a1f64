"""Generated from etcd's v3 API (rpc.proto, kv.proto here; scripts/gen_proto.py): do not edit the
*_pb2* files."""
