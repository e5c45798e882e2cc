// Package sdktest runs a plugin's node in process, exactly as dflow runs
// it as a stage, for plugin authors' tests. It lives apart from package
// sdk so that a plugin binary links neither the runtime nor anything else
// a test needs: only a plugin's tests import it.
package sdktest
