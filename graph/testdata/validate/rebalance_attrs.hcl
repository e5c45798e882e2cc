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
  node = "sink"
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
  stages    = ["reader", "targt", "drafter"]
  every     = "often"
  min_gain  = 2
  move_cost = "-1s"
  spread    = true
}

rebalance {
  stages = ["target", "drafter"]
}
