pipeline "p" {
  descripton = "typo"
}

stages "a" {
  node = "sink"
}

stage "source" {
  node    = "synthetic_source"
  replica = 2
  config {
    count = 3
  }
}

stage "sink" {
  node = "sink"
}

edge "e" {
  from     = source.out
  to       = sink.in
  capacty  = 3
}
