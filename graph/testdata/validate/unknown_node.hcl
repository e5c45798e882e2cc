stage "work" {
  node = "synthetic_wrk"
}

stage "plug" {
  node = "mine/filter"
}
