octl create runner my-runner --set-yaml=@my-runner-config.yaml   # Create a new runner
octl get runner my-runner                                        # Get details on a runner
octl get runners                                                 # List all runners of your organization
octl update runner my-runner --set-yaml=@gke-runner-config.yaml  # Update a runner with a runner config
octl delete runner my-runner                                     # Delete a runner
