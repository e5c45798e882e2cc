#!/bin/sh
# Regenerates the protocol's code from dflow.proto, byte for byte as
# committed: dflow.pb.go and dflow_grpc.pb.go here, and
# ../python/dflowplugin/dflow_pb2.py, the Python SDK's module of it. Run
# by `go generate ./plugins/...` (doc.go).
#
# protoc is Debian's protobuf-compiler 3.21.12 (what the committed files
# name in their headers; another version writes other bytes), and the Go
# plugins are the module's tools (go.mod's tool directives:
# protoc-gen-go v1.36.12, protoc-gen-go-grpc v1.6.2), so their versions
# are the module's and not whatever is on PATH.
set -eu
cd "$(dirname "$0")"
want=3.21.12
command -v protoc > /dev/null || { echo "generate.sh: no protoc on PATH (Debian: apt-get install protobuf-compiler, $want)" >&2; exit 1; }
have=$(protoc --version | sed 's/^libprotoc //')
[ "$have" = "$want" ] || { echo "generate.sh: protoc is $have; the committed files came from $want (Debian's protobuf-compiler), and another version writes other bytes" >&2; exit 1; }
gen_go=$(go tool -n protoc-gen-go)
gen_grpc=$(go tool -n protoc-gen-go-grpc)
protoc -I . \
  --plugin=protoc-gen-go="$gen_go" --go_out=. --go_opt=paths=source_relative \
  --plugin=protoc-gen-go-grpc="$gen_grpc" --go-grpc_out=. --go-grpc_opt=paths=source_relative \
  --python_out=../python/dflowplugin \
  dflow.proto
