stage "source" {
  node = "synthetic_source"
  config {
    count = 4
  }
}

stage "work" {
  node = "synthetic_work"
}
