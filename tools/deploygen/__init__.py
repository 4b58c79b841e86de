"""Generators of what deploy/ holds (the chart's values schema, the Grafana dashboards and
Prometheus rules, the kustomize tree), run by `make chart-schema`, `make dashboards` and
`make kustomize`. Tooling above the product: they import specrl; specrl and its images
never import or ship them."""
