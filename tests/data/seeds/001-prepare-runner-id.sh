export RUNNER_ID=kubernetes-${CLUSTER_NAME}
