# The seed's wiring: a round_robin edge into a rebalanced stage.
stage "reader" {
  node = "synthetic_source"
  config {
    count = 100
  }
}

stage "target" {
  node     = "synthetic_work"
  replicas = 5
}

stage "drafter" {
  node     = "synthetic_work"
  replicas = 3
}

stage "sink" {
  node = "sink"
}

edge "tokens" {
  from = reader.out
  to   = target.in
}

edge "hs" {
  from   = target.out
  to     = drafter.in
  policy = "round_robin"
}

edge "done" {
  from = drafter.out
  to   = sink.in
}

rebalance {
  stages   = ["target", "drafter"]
  replicas = 8
}
