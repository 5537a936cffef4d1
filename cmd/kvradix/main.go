// Command kvradix runs kvradix as a service: `kvradix serve` is the KV
// index over HTTP (package serve), fed by vLLM engines' ZeroMQ events.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvradix/kvradix/cluster"
	"github.com/kvradix/kvradix/ingest/vllm"
	"github.com/kvradix/kvradix/serve"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	if err := run(os.Args[1:], os.Stdout, os.Stderr, stop); err != nil {
		fmt.Fprintln(os.Stderr, "kvradix:", err)
		os.Exit(2)
	}
}

// run is the whole program: a function of its arguments and writers; stop
// delivers SIGINT and SIGTERM, which shut the service down gracefully.
func run(args []string, stdout, stderr io.Writer, stop <-chan os.Signal) (err error) {
	const usage = "usage: kvradix serve [flags]   (kvradix serve -h lists them)"
	switch {
	case len(args) > 0 && helpAsked(args[:1]), len(args) > 0 && args[0] == "help":
		fmt.Fprintln(stdout, usage)
		return nil
	case len(args) == 0 || args[0] != "serve":
		fmt.Fprintln(stderr, usage)
		return errors.New("want a command: serve")
	}
	fs := flag.NewFlagSet("kvradix serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if helpAsked(args[1:]) {
		fs.SetOutput(stdout) // asked for: not an error
	}
	listen := fs.String("listen", "127.0.0.1:8090", "address to serve HTTP on (loopback by default)")
	workers := fs.String("workers", "", "engines to register at start: id=tcp://host:port,... (with -model-name and -block-size)")
	model := fs.String("model-name", "", "model of the -workers engines")
	blockSize := fs.Int("block-size", 16, "tokens per KV block of the -workers engines")
	lanes := fs.Int("lanes", 2, "lanes of each model's index")
	maxBody := fs.Int64("max-body", 8<<20, "the largest request body, in bytes")
	token := fs.String("token", "", "bearer token every endpoint that changes state requires: /register, /unregister, /route, /requests/{id}/first_token and /complete (none: open)")
	ttl := fs.Duration("ttl", 10*time.Minute, "how long a routed request counts in its instance's load without being completed")
	maxIndexes := fs.Int("max-indexes", 256, "the most indexes (one per model and routing group) registrations may create; past it /register answers 503 (a few MB each)")
	maxInstances := fs.Int("max-instances", 1<<14, "the most engines (instance ranks) registered at once; past it /register answers 503")
	maxRouted := fs.Int("max-routed-blocks", 1<<24, "the most blocks the requests in flight (routed, not completed or expired) may hold together, each counting its prompt's blocks and 4 more; past it /route answers 503 (about 160 bytes a block)")
	state := fs.String("state", "", "directory to save the registry and indexes in (on shutdown and every -save-every), and recover them from at start")
	saveEvery := fs.Duration("save-every", time.Minute, "with -state, how often to save while serving (0: on shutdown only)")
	natsURL := fs.String("nats", "", "follow a NATS JetStream bus, so that replicas serve the same indexes: its URL, or \"embedded\" to start one (in -state DIR/nats, or a temporary directory)")
	natsCreds := fs.String("nats-creds", "", "a .creds file (JWT and nkey seed) for -nats")
	natsTokenFile := fs.String("nats-token-file", "", "a file holding the -nats server's token (an embedded server's is DIR/nats/auth-token); or set "+natsTokenEnv+"; never put it in the URL, where ps shows it")
	natsMaxAge := fs.Duration("nats-max-age", 0, "with -nats, keep each model's stream this long at most (0: for good; else at least 10 snapshot intervals, 10m)")
	natsMaxBytes := fs.Int64("nats-max-bytes", 0, "with -nats, keep each model's stream to this many bytes at most (0: no bound)")
	grace := fs.Duration("shutdown-grace", 10*time.Second, "on SIGTERM, how long requests in flight may take before their connections are cut")
	peers := fs.String("peers", "", "other services indexing the same engines, http://host:port,...: started empty (no -state to recover), restore the indexes from the first whose /dump answers")
	peerIdle := fs.Duration("peer-idle-timeout", 30*time.Second, "with -peers, abandon a peer's dump that stops for this long midway, and try the next peer")
	predictTTL := fs.Duration("predict-ttl", 0, "count every /route decision for this long beside the events, merged by max, so that a burst of requests sharing a prefix follows the first before its blocks are stored (0: off; 2s is kv_predict's)")
	stale := fs.Duration("events-stale-after", 0, "route an engine registered with total_kv_blocks on the model of its cache while it has sent no message for this long (0: never)")
	indexBlocks := fs.Int("index-blocks", 0, "size each model's index up front for this many blocks, the engines' KV pools summed (num_gpu_blocks, total_kv_blocks): stores into it then take about a quarter of the time they take while it grows; 8 bytes a slot of its table at a load of 0.7 and 16 bytes of heap a block, taken at the index's creation (0: grow as it fills)")
	tiers := fs.Bool("tiers", false, "keep every tier (host, disk, external): queries answer tier_scores, /route weighs blocks by tier (default: the device only)")
	if err := fs.Parse(args[1:]); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		// Flags end at the first argument that is not one: "-tiers false
		// -listen :9000" would have dropped -listen silently.
		return fmt.Errorf("unexpected argument %q: flags end at the first argument that is not one (a boolean flag takes its value as -flag=false)", fs.Arg(0))
	}
	for _, c := range []struct {
		ok   bool
		flag string
		v    any
		want string
	}{
		{*lanes >= 1 && *lanes <= serve.MaxLanes, "lanes", *lanes, fmt.Sprintf("1 to %d", serve.MaxLanes)},
		{*indexBlocks >= 0 && *indexBlocks <= serve.MaxIndexBlocks, "index-blocks", *indexBlocks, fmt.Sprintf("0 (grow as it fills) to %d", serve.MaxIndexBlocks)},
		{*maxBody >= serve.MinBodyBytes && *maxBody <= serve.MaxBodyCap, "max-body", *maxBody, fmt.Sprintf("%d to %d", serve.MinBodyBytes, serve.MaxBodyCap)},
		{*ttl >= serve.MinRequestTTL, "ttl", *ttl, fmt.Sprintf("at least %v", serve.MinRequestTTL)},
		{*maxIndexes >= 1, "max-indexes", *maxIndexes, "1 or more"},
		{*maxInstances >= 1, "max-instances", *maxInstances, "1 or more"},
		{*maxRouted >= 1 && *maxRouted <= serve.MaxRoutedBlocksCap, "max-routed-blocks", *maxRouted, fmt.Sprintf("1 to %d", serve.MaxRoutedBlocksCap)},
		{*saveEvery == 0 || *saveEvery >= serve.MinSaveEvery, "save-every", *saveEvery, fmt.Sprintf("0 (on shutdown only) or at least %v", serve.MinSaveEvery)},
		{*blockSize >= 1 && *blockSize <= serve.MaxBlockSize, "block-size", *blockSize, fmt.Sprintf("1 to %d", serve.MaxBlockSize)},
		{*grace >= 0, "shutdown-grace", *grace, "0 or more"},
		{*stale >= 0, "events-stale-after", *stale, "0 (never) or more"},
		{*predictTTL >= 0, "predict-ttl", *predictTTL, "0 (off) or more"},
		{*peerIdle > 0, "peer-idle-timeout", *peerIdle, "more than 0"},
	} {
		if !c.ok {
			return fmt.Errorf("-%s %v: want %s", c.flag, c.v, c.want)
		}
	}
	bc := serve.BusConfig{URL: *natsURL, MaxAge: *natsMaxAge, MaxBytes: *natsMaxBytes}
	if err := checkBusFlags(fs, bc); err != nil {
		return err
	}
	peerURLs, err := parsePeers(*peers)
	if err != nil {
		return fmt.Errorf("-peers: %w", err)
	}
	regs, err := parseWorkers(*workers, *model, *blockSize)
	if err != nil {
		return fmt.Errorf("-workers: %w", err)
	}
	unlock, err := checkServing(*listen, *token, *state)
	if err != nil {
		return err
	}
	defer unlock()
	// Listening comes first, so that a bad or taken address is refused
	// before a recovery that may take minutes.
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("-listen: %w", err)
	}
	defer ln.Close() // served (Serve closes it too), or never
	cfg := serve.Config{Lanes: *lanes, IndexBlocks: *indexBlocks, MaxBodyBytes: *maxBody, Token: *token, StateDir: *state, RequestTTL: *ttl, MaxRoutedBlocks: *maxRouted, MaxIndexes: *maxIndexes, MaxInstances: *maxInstances, HoldWhileRecovering: true,
		SaveEvery: *saveEvery, Tiers: *tiers, Peers: peerURLs, PeerIdleTimeout: *peerIdle, EventsStaleAfter: *stale, PredictTTL: *predictTTL, OnSaveError: func(err error) { fmt.Fprintln(stderr, "kvradix: saving the state:", err) }}
	cfg.Subscriber.OnLoss = newLossLog(stderr, time.Second).log
	if bc.Auth, err = natsAuth(*natsCreds, *natsTokenFile, os.Getenv(natsTokenEnv)); err != nil {
		return err
	}
	svc, stopBus, err := open(cfg, bc, stdout)
	if err != nil {
		return err
	}
	defer stopBus()
	// Closing saves the state (with -state): a failure there is state
	// lost, and the exit status says so.
	defer func() {
		if cerr := svc.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("closing (state may be lost): %w", cerr))
		}
	}()
	// The service answers while it recovers, which may take minutes:
	// /health says it lives, /ready that it is recovering, reads answer
	// what is back so far, and what would change its state waits (503,
	// Config.HoldWhileRecovering).
	srv := &http.Server{Handler: svc.Handler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	fmt.Fprintf(stdout, "kvradix: serving on http://%s\n", ln.Addr())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln); close(served) }()
	defer shutdown(srv, served, *grace, stdout, stderr)
	if recoverService(svc, stop, stdout) {
		fmt.Fprintln(stdout, "kvradix: stopped while recovering")
		return nil
	}
	for _, r := range regs {
		if err := svc.Register(r); err != nil {
			return fmt.Errorf("-workers: instance %d: %w", r.InstanceID, err)
		}
	}
	fmt.Fprintln(stdout, "kvradix: ready")
	select {
	case err := <-served:
		return err
	case <-stop:
	}
	return nil
}

// shutdown stops serving gracefully: requests in flight finish (grace at
// most; a client still sending then is cut, which loses nothing of ours).
// The subscribers and indexes close after, as the service does.
func shutdown(srv *http.Server, served <-chan error, grace time.Duration, stdout, stderr io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		fmt.Fprintf(stderr, "kvradix: connections still open after %v were cut: %v\n", grace, err)
		srv.Close()
	}
	<-served
	fmt.Fprintln(stdout, "kvradix: stopped")
}

// natsTokenEnv is the environment variable -nats's token may come in.
const natsTokenEnv = "KVRADIX_NATS_TOKEN"

// checkBusFlags refuses, before anything starts, -nats-* flags without
// -nats (which would go unheard) and stream bounds the bus would refuse.
func checkBusFlags(fs *flag.FlagSet, bc serve.BusConfig) error {
	var set, auth []string
	fs.Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "nats-") {
			set = append(set, "-"+f.Name)
		}
		if f.Name == "nats-creds" || f.Name == "nats-token-file" {
			auth = append(auth, "-"+f.Name)
		}
	})
	switch {
	case bc.URL == "" && len(set) > 0:
		return fmt.Errorf("%s without -nats", strings.Join(set, ", "))
	case bc.URL == "embedded" && len(auth) > 0:
		// The embedded server makes its own token; these were ignored.
		return fmt.Errorf("%s with -nats embedded: the embedded server makes its own token (its directory's auth-token), for the other replicas' -nats-token-file", strings.Join(auth, ", "))
	case bc.URL != "":
		if err := bc.Validate(); err != nil {
			return fmt.Errorf("-nats-max-age %v, -nats-max-bytes %d: %w", bc.MaxAge, bc.MaxBytes, err)
		}
	}
	return nil
}

// natsAuth returns the bus credentials: a .creds file, or a token from a
// file or the environment (never from argv, which any local user sees).
func natsAuth(creds, tokenFile, tokenEnv string) (cluster.Auth, error) {
	a := cluster.Auth{CredsFile: creds, Token: strings.TrimSpace(tokenEnv)}
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return a, fmt.Errorf("-nats-token-file: %w", err)
		}
		a.Token = strings.TrimSpace(string(b))
	}
	return a, nil
}

// open returns the service: on its own, or following the bus at bc.URL
// ("embedded": a server started here, stopped by the returned func after
// the service closes, its temporary directory, where -state gives none,
// removed then). No error or line it prints carries the bus's token.
func open(cfg serve.Config, bc serve.BusConfig, stdout io.Writer) (*serve.Service, func(), error) {
	if bc.URL == "" {
		return serve.New(cfg), func() {}, nil
	}
	stop := func() {}
	if bc.URL == "embedded" {
		dir, removeDir := filepath.Join(cfg.StateDir, "nats"), func() {}
		if cfg.StateDir == "" {
			var err error
			if dir, err = os.MkdirTemp("", "kvradix-nats-"); err != nil {
				return nil, nil, fmt.Errorf("-nats: %w", err)
			}
			removeDir = func() { _ = os.RemoveAll(dir) }
		}
		srv, err := cluster.StartEmbedded(dir)
		if err != nil {
			removeDir()
			return nil, nil, fmt.Errorf("-nats: %w", err)
		}
		stop = func() {
			srv.Shutdown()
			removeDir()
		}
		bc.URL = srv.URL()
		fmt.Fprintf(stdout, "kvradix: NATS bus on 127.0.0.1:%d; other replicas: -nats nats://127.0.0.1:%d -nats-token-file %s\n",
			srv.Port(), srv.Port(), filepath.Join(dir, "auth-token"))
	}
	svc, err := serve.NewOnBus(cfg, bc)
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("-nats %s: %s", cluster.Redact(bc.URL), redactToken(err.Error(), bc.Auth.Token))
	}
	return svc, stop, nil
}

// redactToken removes a token from a message, wherever it appears.
func redactToken(msg, token string) string {
	if token == "" {
		return msg
	}
	return strings.ReplaceAll(msg, token, "REDACTED")
}

// parseWorkers reads id=endpoint,... into registrations.
func parseWorkers(s, model string, blockSize int) ([]serve.Registration, error) {
	if s == "" {
		return nil, nil
	}
	if model == "" {
		return nil, errors.New("needs -model-name")
	}
	var out []serve.Registration
	for _, f := range strings.Split(s, ",") {
		id, ep, ok := strings.Cut(strings.TrimSpace(f), "=")
		n, err := strconv.ParseUint(id, 10, 64)
		if !ok || err != nil || ep == "" {
			return nil, fmt.Errorf("%q is not id=endpoint", f)
		}
		r := serve.Registration{InstanceID: n, Endpoint: ep, ModelName: model, BlockSize: blockSize}
		if err := r.Check(); err != nil {
			return nil, fmt.Errorf("instance %d: %w", n, err)
		}
		if slices.ContainsFunc(out, func(o serve.Registration) bool { return o.InstanceID == n }) {
			return nil, fmt.Errorf("instance %d given twice", n)
		}
		out = append(out, r)
	}
	return out, nil
}

// lossLog writes engines' losses (batches lost, events that did not
// decode) to w, at most one line per engine per interval; the lines held
// back are counted in the next.
type lossLog struct {
	w     io.Writer
	every time.Duration
	mu    sync.Mutex
	last  map[string]time.Time // by engine address
	held  map[string]int
}

func newLossLog(w io.Writer, every time.Duration) *lossLog {
	return &lossLog{w: w, every: every, last: map[string]time.Time{}, held: map[string]int{}}
}

func (l *lossLog) log(loss vllm.Loss) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if now.Sub(l.last[loss.Address]) < l.every {
		l.held[loss.Address]++
		return
	}
	l.last[loss.Address] = now
	more := ""
	if n := l.held[loss.Address]; n > 0 {
		more = fmt.Sprintf(" (and %d more since the last line)", n)
		delete(l.held, loss.Address)
	}
	fmt.Fprintf(l.w, "kvradix: %v%s\n", loss, more)
}

// helpAsked reports whether args ask for help (-h, -help, --help) before
// any non-flag argument.
func helpAsked(args []string) bool {
	for _, a := range args {
		switch a {
		case "-h", "-help", "--h", "--help":
			return true
		case "--":
			return false
		}
	}
	return false
}

// recoverService recovers the service's state, or its indexes from its
// peers, and says what came back. A stop signal meanwhile abandons the
// recovery (a peer may take minutes to answer, or never), and it reports
// that one came.
func recoverService(svc *serve.Service, stop <-chan os.Signal, stdout io.Writer) (stopped bool) {
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-stop:
			stopped = true
			cancel()
		case <-ctx.Done():
		}
	}()
	rec, err := svc.RecoverContext(ctx)
	cancel()
	<-watched
	switch {
	case err != nil:
		fmt.Fprintf(stdout, "kvradix: the saved state was refused, starting empty: %v\n", err)
	default:
		if rec.Indexes > 0 || rec.Instances > 0 {
			fmt.Fprintf(stdout, "kvradix: recovered %d indexes (%d pairs) and %d engines, resuming where they stood\n", rec.Indexes, rec.Pairs, rec.Instances)
		}
		if rec.Peer != "" {
			fmt.Fprintf(stdout, "kvradix: restored the indexes from peer %s (%d events)\n", rec.Peer, rec.PeerEvents)
		}
		for _, f := range rec.Failed {
			fmt.Fprintf(stdout, "kvradix: not recovered: %s\n", f)
		}
	}
	return stopped
}

// parsePeers reads -peers: URLs separated by commas, each once.
func parsePeers(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if err := serve.CheckPeer(item); err != nil {
			return nil, err
		}
		u := strings.TrimSuffix(item, "/")
		if slices.Contains(out, u) {
			return nil, fmt.Errorf("%s given twice", u)
		}
		out = append(out, u)
	}
	if len(out) > serve.MaxPeers {
		return nil, fmt.Errorf("%d peers, at most %d", len(out), serve.MaxPeers)
	}
	return out, nil
}

// checkServing refuses, before anything starts, what would only show
// later: an empty -listen (Go would listen on every interface, where the
// default is loopback), a -token no Authorization header can carry (the
// service would refuse every caller), and a -state that is not a
// directory the service can write (the state would be lost at the first
// save, or on shutdown) or that another service uses (see lockState). It
// returns the release of the state's lock.
func checkServing(listen, token, state string) (unlock func(), err error) {
	if listen == "" {
		return nil, errors.New("-listen: empty; give host:port (:PORT listens on every interface)")
	}
	if strings.ContainsFunc(token, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return nil, errors.New("-token: holds a space, a control character or a character past ASCII, which a bearer header cannot carry")
	}
	if state == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(state, 0o700); err != nil { // as the service makes it: the state holds the registry
		return nil, fmt.Errorf("-state: %w", err)
	}
	probe, err := os.CreateTemp(state, ".kvradix-probe-*")
	if err != nil {
		return nil, fmt.Errorf("-state: %w", err)
	}
	probe.Close()
	if err := os.Remove(probe.Name()); err != nil {
		return nil, fmt.Errorf("-state: %w", err)
	}
	return lockState(state)
}
