package cluster

// The network faults beyond a clean cut: a slow path, replies lost, a partition that ends before
// either side gave up, and the leader lock's session cut alone.

// SlowNetwork slows every connection of client's path, to PostgreSQL and to Kafka, open or new,
// by s; the zero Shaping ends it.
func (c *Cluster) SlowNetwork(client string, s Shaping) {
	for _, p := range c.paths(client).all() {
		p.Shape(s)
	}
}

// CutPostgresReplies drops what PostgreSQL sends to client (the leader lock's session too) while
// what client sends still reaches it: a statement runs, a COMMIT commits, and the answer is lost.
// HealPostgres ends it.
func (c *Cluster) CutPostgresReplies(client string) {
	for _, p := range c.paths(client).postgres() {
		p.CutReplies()
	}
}

// CutKafkaReplies drops what the brokers send to client while what client sends still reaches
// them: a produce is appended, its acknowledgement lost. HealKafka ends it.
func (c *Cluster) CutKafkaReplies(client string) {
	for _, p := range c.paths(client).kafka {
		p.CutReplies()
	}
}

// CutAll partitions client from PostgreSQL and Kafka as CutPostgres and CutKafka do.
func (c *Cluster) CutAll(client string) {
	for _, p := range c.paths(client).all() {
		p.Cut()
	}
}

// HealAllOpen ends CutAll before either side gave up: every connection held goes on with what it
// held, and those accepted during the cut are dialled now.
func (c *Cluster) HealAllOpen(client string) {
	for _, p := range c.paths(client).all() {
		p.HealOpen()
	}
}

// CutLeaderLock partitions client's leader lock session alone (ClientLeaderDSN) as CutPostgres
// does: its replication and other connections to PostgreSQL, and Kafka, go on.
func (c *Cluster) CutLeaderLock(client string) {
	for _, p := range c.paths(client).leader {
		p.Cut()
	}
}

// HealLeaderLock ends CutLeaderLock: the connections held are closed with a reset.
func (c *Cluster) HealLeaderLock(client string) {
	for _, p := range c.paths(client).leader {
		p.Heal()
	}
}
