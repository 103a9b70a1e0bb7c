# The admission policy of BENCHMARKS.md §0h/§0j: every simulated node
# passes four conditions, as a fleet's own policy would check its nodes.
#   scripts/bench.sh --scenario template --nodes 10000 --runs 1 --no-go \
#     --set rego_policy=$PWD/scripts/bench-policy.rego
package choria.provisioner

default allow := false

allow if {
	"choria_provision" in input.agents
	startswith(input.identity, "node-")
	endswith(input.identity, ".fleet.example.net")
	count(input.collectives) > 0
}

defer if input.facts.maintenance == true

deny_reason := sprintf("%v is not a node of this fleet", [input.identity]) if not allow
