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
  node     = "sink"
  replicas = 4
}

edge "tokens" {
  from = reader.out
  to   = target.in
}

edge "hs" {
  from = target.out
  to   = drafter.in
}

rebalance {
  stages   = ["target", "drafter"]
  replicas = 8
}
