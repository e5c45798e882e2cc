package share

// The floor under small items at a small capacity (docs/performance.md,
// "Across hosts"; bench/cluster prints it): a bare round trip between two
// processes through the server, and the least two processes do with a
// queue's credit protocol on JetStream, each beside dflow's own rate.

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflow-dev/dflow/internal/cluster/broker"
	"github.com/dflow-dev/dflow/internal/testutil"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkRoundTrip is the floor under small items at a small capacity:
// a bare request and its reply between two processes other than the
// server's (the test binary run again twice), through the embedded server
// in this one, as a coordinator's; each of the three runs Go code on a
// third of the cores, at least one, as `dflow run --local-cluster 2`
// shares them. A turn of a queue's credit is at least such a round trip
// (a publish reaches the consumer's worker through the server, and its
// grant comes back the same way), with JetStream's store on top. It
// reports the round trip's median and mean (rtt-median-ns, rtt-mean-ns);
// ns/op adds the start of both other processes, and the asker's wait
// until the answers begin, spread over b.N.
func BenchmarkRoundTrip(b *testing.B) {
	srv, children := twoProcesses(b)
	defer srv.Shutdown()
	answer := children("answer", nil)
	if err := answer.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { answer.Process.Kill(); answer.Wait() }()
	var got strings.Builder
	b.ResetTimer()
	if err := children("ask", &got).Run(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	var median, mean float64
	if _, err := fmt.Sscan(got.String(), &median, &mean); err != nil {
		b.Fatalf("the asking process said %q: %v", got.String(), err)
	}
	b.ReportMetric(median, "rtt-median-ns")
	b.ReportMetric(mean, "rtt-mean-ns")
}

// BenchmarkCreditLoop is the credit's own floor: the least a producer and
// a consumer in two processes can do with the protocol a queue on
// JetStream speaks (package edge), nothing of dflow's around it. The
// producer publishes 64 B messages asynchronously, each with an id,
// within a credit of the capacity (8, the default); the consumer keeps
// pull requests under way for the room of an inbox of the capacity, acks
// each message, and grants what came on a word to the producer once a
// burst is in. Streams and processes are as a run's: a work-queue stream
// in memory on the embedded server in this process, the two others each
// on a third of the cores. It reports the consumer's rate (items/s), from
// its first message to its last.
func BenchmarkCreditLoop(b *testing.B) {
	srv, children := twoProcesses(b)
	defer srv.Shutdown()
	ctx := context.Background()
	nc, err := broker.Connect(broker.ConnOptions{URL: srv.URL, Token: srv.Token})
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: loopStream, Subjects: []string{loopSubject},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage, Duplicates: 2 * time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second}); err != nil {
		b.Fatal(err)
	}
	var got strings.Builder
	cons := children("consume", &got)
	if err := cons.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cons.Process.Kill(); cons.Wait() }()
	b.ResetTimer()
	if err := children("produce", nil).Run(); err != nil {
		b.Fatal(err)
	}
	if err := cons.Wait(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	var rate float64
	if _, err := fmt.Sscan(got.String(), &rate); err != nil {
		b.Fatalf("the consuming process said %q: %v", got.String(), err)
	}
	b.ReportMetric(rate, "items/s")
}

// twoProcesses starts an embedded server, this process on a third of the
// cores (restored at the benchmark's end) unless GOMAXPROCS says
// otherwise, as run.LocalProcs shares them, and returns it with a maker
// of the commands that run this test binary again in a role of echo's.
// A command still running after a minute and a millisecond a request or
// item (a grant word lost, say, or the other end gone) is killed, and so
// fails the benchmark rather than hang it.
func twoProcesses(b *testing.B) (*broker.Server, func(role string, out io.Writer) *exec.Cmd) {
	env := []string{echoNEnv + "=" + strconv.Itoa(b.N)}
	if os.Getenv("GOMAXPROCS") == "" {
		procs := max(1, runtime.GOMAXPROCS(0)/3)
		was := runtime.GOMAXPROCS(procs)
		b.Cleanup(func() { runtime.GOMAXPROCS(was) })
		env = append(env, "GOMAXPROCS="+strconv.Itoa(procs))
	}
	bound := time.Minute + time.Duration(b.N)*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	b.Cleanup(cancel)
	srv, err := broker.StartServer(broker.ServerOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return srv, func(role string, out io.Writer) *exec.Cmd {
		cmd := exec.CommandContext(ctx, os.Args[0])
		cmd.Env = append(append(os.Environ(), env...), echoEnv+"="+role, echoURLEnv+"="+srv.URL, echoTokenEnv+"="+srv.Token)
		cmd.Stdout, cmd.Stderr = out, os.Stderr
		cmd.Cancel = func() error {
			fmt.Fprintf(os.Stderr, "echo %s: still running after %v: killed\n", role, bound)
			return cmd.Process.Kill()
		}
		return cmd
	}
}

// The other processes of BenchmarkRoundTrip and BenchmarkCreditLoop:
// their role, the server, its token, and how many requests or items.
const (
	echoEnv      = "DFLOW_BENCH_ECHO"
	echoURLEnv   = "DFLOW_BENCH_ECHO_URL"
	echoTokenEnv = "DFLOW_BENCH_ECHO_TOKEN"
	echoNEnv     = "DFLOW_BENCH_ECHO_N"
	echoSubject  = "dflow.bench.echo"
	loopStream   = "LOOPBENCH"
	loopSubject  = "loopbench"
	loopRoom     = "loopbench.room"
	loopCapacity = 8
)

// echo is one of the benchmarks' other processes. "answer" answers each
// request with its own bytes until killed (or the server is gone); "ask"
// times requests (echoAsk). "produce" and "consume" are
// BenchmarkCreditLoop's two ends; the consumer prints its rate.
func echo(role string) {
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "echo %s: %v\n", role, err)
		os.Exit(1)
	}
	closed := make(chan struct{})
	nc, err := broker.Connect(broker.ConnOptions{URL: os.Getenv(echoURLEnv), Token: os.Getenv(echoTokenEnv),
		OnClosed: func() { close(closed) }})
	if err != nil {
		fail(err)
	}
	defer nc.Close()
	n, err := strconv.Atoi(os.Getenv(echoNEnv))
	if err != nil {
		fail(err)
	}
	switch role {
	case "answer":
		if _, err := nc.Subscribe(echoSubject, func(m *nats.Msg) { m.Respond(m.Data) }); err != nil {
			fail(err)
		}
		<-closed // not before the server is gone, should the benchmark not kill it
		err = fmt.Errorf("the connection to the server is closed")
	case "ask":
		err = echoAsk(nc, n)
	case "produce":
		err = loopProduce(nc, n)
	case "consume":
		err = loopConsume(nc, n)
	default:
		err = fmt.Errorf("no such role")
	}
	if err != nil {
		fail(err)
	}
}

// echoAsk waits for the answers to begin, times n requests one after another
// and prints their median and mean in nanoseconds.
func echoAsk(nc *nats.Conn, n int) error {
	if !testutil.Within(30*time.Second, func() bool {
		_, err := nc.Request(echoSubject, []byte("x"), 100*time.Millisecond)
		return err == nil
	}) {
		return fmt.Errorf("no answer within 30s")
	}
	took := make([]time.Duration, 0, n)
	var sum time.Duration
	for range n {
		t := time.Now()
		if _, err := nc.Request(echoSubject, []byte("x"), 5*time.Second); err != nil {
			return err
		}
		took = append(took, time.Since(t))
		sum += took[len(took)-1]
	}
	slices.Sort(took)
	fmt.Println(took[len(took)/2].Nanoseconds(), (sum / time.Duration(max(n, 1))).Nanoseconds())
	return nil
}

// loopProduce publishes n messages within the credit the consumer grants.
func loopProduce(nc *nats.Conn, n int) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	more := sync.NewCond(&mu)
	credit := loopCapacity
	if _, err := nc.Subscribe(loopRoom, func(m *nats.Msg) {
		k, _ := strconv.Atoi(string(m.Data))
		mu.Lock()
		credit = min(credit+k, loopCapacity)
		more.Broadcast()
		mu.Unlock()
	}); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	payload := make([]byte, 64)
	for i := range n {
		mu.Lock()
		for credit == 0 {
			more.Wait()
		}
		credit--
		mu.Unlock()
		m := nats.NewMsg(loopSubject)
		m.Data = payload
		m.Header.Set(jetstream.MsgIDHeader, strconv.Itoa(i))
		if _, err := js.PublishMsgAsync(m); err != nil {
			return err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-time.After(time.Minute):
		return fmt.Errorf("publishes unanswered after a minute")
	}
}

// loopConsume takes n messages with pull requests of its own, acking
// each and granting what came once a burst is in, and prints its rate.
func loopConsume(nc *nats.Conn, n int) error {
	msgs := make(chan *nats.Msg, 2*loopCapacity+16)
	reply := nc.NewInbox()
	if _, err := nc.ChanSubscribe(reply, msgs); err != nil {
		return err
	}
	next := broker.NextSubject(loopStream, "c")
	asked, granted, got := 0, 0, 0
	var first time.Time
	for got < n {
		if granted > 0 && len(msgs) == 0 {
			nc.Publish(loopRoom, []byte(strconv.Itoa(granted)))
			granted = 0
		}
		if room := loopCapacity - asked; room >= max(1, loopCapacity/4) {
			if err := nc.PublishRequest(next, reply, broker.PullRequest(room, 200*time.Millisecond)); err != nil {
				return err
			}
			asked += room
		}
		m := <-msgs
		if broker.IsStatus(m) {
			k, err := broker.PullStatus(m)
			if err != nil {
				return err
			}
			asked -= k
			continue
		}
		if got == 0 {
			first = time.Now()
		}
		asked--
		got++
		granted++
		if err := m.Respond([]byte("+ACK")); err != nil {
			return err
		}
	}
	fmt.Println(float64(n-1) / time.Since(first).Seconds())
	return nc.Flush()
}
