package wire

import (
	"context"

	"github.com/dflow-dev/dflow/plugins/proto"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// Handshake is the go-plugin handshake both sides share. A plugin started
// by hand (not by dflow) explains it is a plugin and exits. Its
// ProtocolVersion is the oldest version dflow speaks; Versions adds the
// newer ones, which go-plugin negotiates (PLUGIN_PROTOCOL_VERSIONS).
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  1,
	MagicCookieKey:   "DFLOW_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "dflow-node-plugin-v1",
}

// LifelineEnv tells a plugin that dflow holds the write end of its stdin,
// a pipe no one writes to: when it reads end-of-file, dflow has gone,
// however it ended (SIGKILL included), and the plugin exits. Processes a
// wrapper script starts inherit the pipe, so a plugin that a shell runs
// without exec sees it too.
const LifelineEnv = "DFLOW_PLUGIN_LIFELINE"

// PluginName is the one plugin a dflow plugin process serves.
const PluginName = "node"

// streamWindow is the HTTP/2 flow-control window of the stream and the
// connection between dflow and a plugin, both ways. gRPC's default starts
// at 64 KiB and grows only as it measures the connection, so a large item
// crosses in many round trips of window updates; between two processes on
// one host the window only needs to bound the memory in flight.
const streamWindow = 16 << 20

// ioBuffer is the size of the buffers gRPC writes to and reads from the
// socket through, both ways (32 KiB by default): a large item then
// crosses in far fewer system calls. 16 MiB items went there and back
// 10-15% faster (BenchmarkPluginStage, alternating runs); small items
// are unchanged.
const ioBuffer = 1 << 20

// ServerOptions are the gRPC options of a plugin's server (Serve uses
// them), DialOptions dflow's; they set the flow-control windows and the
// socket buffers.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.InitialWindowSize(streamWindow), grpc.InitialConnWindowSize(streamWindow),
		grpc.WriteBufferSize(ioBuffer), grpc.ReadBufferSize(ioBuffer)}
}

// DialOptions: see ServerOptions.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithInitialWindowSize(streamWindow), grpc.WithInitialConnWindowSize(streamWindow),
		grpc.WithWriteBufferSize(ioBuffer), grpc.WithReadBufferSize(ioBuffer)}
}

// grpcPlugin is the go-plugin glue: the server side registers a
// proto.NodeServer, the client side returns a proto.NodeClient.
type grpcPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	impl proto.NodeServer
}

func (p *grpcPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	proto.RegisterNodeServer(s, p.impl)
	return nil
}

func (p *grpcPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return proto.NewNodeClient(c), nil
}

// ProtocolVersion is the newest version of the protocol: 2 adds group
// kinds (Kind.group, Collective). A plugin that answers 1 speaks the rest.
const ProtocolVersion = 2

// Versions is the plugin set of each version newer than Handshake's, for
// go-plugin's VersionedPlugins; impl is nil on the client.
func Versions(impl proto.NodeServer) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{ProtocolVersion: PluginMap(impl)}
}

// PluginMap is the plugin set of both sides; impl is nil on the client.
func PluginMap(impl proto.NodeServer) map[string]plugin.Plugin {
	return map[string]plugin.Plugin{PluginName: &grpcPlugin{impl: impl}}
}
