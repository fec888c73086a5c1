# Create the runner
octl create runner my-gke-runner --set-yaml=@gke-runner-config.yaml

# Create an empty runner rule that will always match
octl create runner-rule --set=runner_id=my-gke-runner
