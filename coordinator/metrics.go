package coordinator

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the coordinator's own instruments. They are registered
// nowhere: Collector exposes them to a registry of the caller's choosing.
type metrics struct {
	members         prometheus.Gauge
	claims          prometheus.Counter
	releases        prometheus.Counter
	staleRejections prometheus.Counter
	gossipDropped   prometheus.Counter
	reachChecks     prometheus.Counter
	reachPings      prometheus.Counter
	rejoins         prometheus.Counter
	lag             prometheus.Gauge
	late            prometheus.Gauge
	unreachable     prometheus.Gauge
	failover        prometheus.Histogram
	handoff         prometheus.Histogram
}

func newMetrics() *metrics {
	buckets := []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	return &metrics{
		members: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "tenure", Name: "members", Help: "Members in this node's partition table."}),
		claims: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "tenure", Name: "claims_total", Help: "Claims this node asked its authority for."}),
		releases: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "tenure", Name: "releases_total", Help: "Partitions this node released (handoffs and given-back claims)."}),
		staleRejections: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "tenure", Name: "stale_rejections_total", Help: "Writes under this node's leases that a fence rejected as stale (reported with ReportStale)."}),
		gossipDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "tenure", Name: "gossip_dropped_total", Help: "Gossip messages and claims refused: malformed, from another cluster, unauthenticated, or with an implausible epoch."}),
		reachChecks: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "tenure", Name: "reach_checks_total", Help: "Reach checks: rounds of direct pings while memberlist reported trouble (a health score above zero), or, while the node starts, to members of the list its join took that it has had no word from."}),
		reachPings: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "tenure", Name: "reach_pings_total", Help: "Direct pings the reach checks sent: at most max(4, ceil(log2 members)) a round, none while the node is late."}),
		rejoins: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "tenure", Name: "rejoins_total", Help: "Joins this node started to bring back members it lost (and seeds, while one is lost): each sends the whole register both ways. A member that vanished without leaving is re-joined for ReconnectTimeout; a steady rate otherwise means members keep looking dead."}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "tenure", Name: "loop_lag_seconds", Help: "The largest delay, over the reach check's span, between a tick of this node's loop firing and the loop running it."}),
		late: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "tenure", Name: "late", Help: "1 while the loop lag exceeds half a ProbeTimeout: the node is too slow to keep its promises (its reach check is suspended, its step-down is late by the lag)."}),
		unreachable: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "tenure", Name: "unreachable_members", Help: "Members in the view that missed the last reach checks: they don't count for quorum."}),
		failover: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "tenure", Name: "failover_seconds", Buckets: buckets,
			Help: "From the table dropping a failed owner to this node owning its partition."}),
		handoff: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "tenure", Name: "handoff_seconds", Buckets: buckets,
			Help: "From the table moving a partition here to this node owning it, when the previous holder released it."}),
	}
}

// Collector returns a prometheus.Collector of this coordinator's metrics:
// members, owned partitions, claims, releases, stale rejections, dropped
// gossip, reach checks and their pings, rejoins, the loop's lag and whether it is
// late, unreachable members, and failover and handoff
// latency histograms. Register it with the caller's registry; the
// coordinator registers nothing globally.
func (c *Coordinator) Collector() prometheus.Collector { return collector{c} }

type collector struct{ c *Coordinator }

var ownedDesc = prometheus.NewDesc("tenure_owned_partitions", "Partitions this node holds a live lease on.", nil, nil)

func (k collector) instruments() []prometheus.Collector {
	m := k.c.metrics
	return []prometheus.Collector{m.members, m.claims, m.releases, m.staleRejections, m.gossipDropped, m.reachChecks, m.reachPings, m.rejoins, m.lag, m.late, m.unreachable, m.failover, m.handoff}
}

func (k collector) Describe(ch chan<- *prometheus.Desc) {
	for _, i := range k.instruments() {
		i.Describe(ch)
	}
	ch <- ownedDesc
}

func (k collector) Collect(ch chan<- prometheus.Metric) {
	for _, i := range k.instruments() {
		i.Collect(ch)
	}
	ch <- prometheus.MustNewConstMetric(ownedDesc, prometheus.GaugeValue, float64(k.c.ownedCount()))
}

func (c *Coordinator) ownedCount() int {
	n := 0
	for p := range uint32(c.cfg.Ring.Partitions) {
		if c.leases.lookup(p) != nil {
			n++
		}
	}
	return n
}
