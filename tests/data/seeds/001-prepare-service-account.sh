export RUNNER_K8S_SA=humanitec-runner
