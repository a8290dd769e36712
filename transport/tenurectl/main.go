package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/tenure-go/tenure/transport/ownershippb"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// errUsage marks an error in how the command was called (exit status 2).
var errUsage = errors.New("usage")

// cli is one invocation: the connection and how to print.
type cli struct {
	addr    string
	json    bool
	timeout time.Duration
	client  pb.OwnershipClient
	out     io.Writer // results
	errOut  io.Writer // errors and notes beside -json results
}

const usage = `usage: tenurectl [flags] command [args]

commands:
  owner KEY...   who owns each key (-hex: the keys are hex)
  map            the partition map by owner (-rows: one row per partition)
  watch          every move as it happens (-for D, -count N)
  status         the node's health and members

flags:
`

// run is the whole command; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tenurectl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	c := &cli{out: stdout, errOut: stderr}
	fs.StringVar(&c.addr, "addr", os.Getenv("TENURE_ADDR"), "the node's gRPC address, host:port (default $TENURE_ADDR)")
	fs.BoolVar(&c.json, "json", false, "print JSON instead of tables")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "bound of each call (for watch: of the first snapshot)")
	caFile := fs.String("ca", "", "PEM file of the CA that signed the node's certificate: use TLS (default: plaintext)")
	serverName := fs.String("server-name", "", "the name to check in the node's certificate (with -ca; default: the host of -addr)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	if c.addr == "" {
		fmt.Fprintln(stderr, "tenurectl: no node address: give -addr host:port or set TENURE_ADDR")
		return 2
	}
	if c.timeout <= 0 {
		fmt.Fprintln(stderr, "tenurectl: -timeout must be positive")
		return 2
	}
	creds := insecure.NewCredentials()
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			fmt.Fprintf(stderr, "tenurectl: -ca: %v\n", err)
			return 2
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fmt.Fprintf(stderr, "tenurectl: -ca %s holds no PEM certificate\n", *caFile)
			return 2
		}
		creds = credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: *serverName, MinVersion: tls.VersionTLS12})
	}
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		fmt.Fprintf(stderr, "tenurectl: -addr %q: %v\n", c.addr, err)
		return 2
	}
	defer conn.Close()
	c.client = pb.NewOwnershipClient(conn)

	cmd, rest := fs.Arg(0), fs.Args()[1:]
	switch cmd {
	case "owner":
		err = c.owner(ctx, rest)
	case "map":
		err = c.partitionMap(ctx, rest)
	case "watch":
		err = c.watch(ctx, rest)
	case "status":
		err = c.status(ctx, rest)
	default:
		err = fmt.Errorf("%w: unknown command %q (owner, map, watch, status)", errUsage, cmd)
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "tenurectl %s: %v\n", cmd, err)
		return 2
	default:
		fmt.Fprintf(stderr, "tenurectl %s: %v\n", cmd, err)
		return 1
	}
}

// callError says what a failed call to the node means.
func (c *cli) callError(what string, err error) error {
	st, _ := status.FromError(err)
	return fmt.Errorf("%s at %s: %s: %s", what, c.addr, st.Code(), st.Message())
}

// subFlags parses a command's own flags.
func subFlags(name string, args []string, define func(fs *flag.FlagSet)) (*flag.FlagSet, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	define(fs)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	return fs, nil
}
